"""The people's pages that tools_app owns: sign-in, sign-out, the dashboard and error pages."""

from django.contrib.auth import logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.views import View

from .api.errors import error_body
from .api.views import health_report
from .gateway import gateway
from .models import CallStatus, ToolCall
from .services import person_roles


class LoginView(auth_views.LoginView):
    template_name = "login.html"
    redirect_authenticated_user = True


class LogoutView(View):
    """GET asks, POST signs out: a link alone must not end a session."""

    def get(self, request):
        return render(request, "logout.html")

    def post(self, request):
        logout(request)
        return HttpResponseRedirect("/login/")


@login_required
def dashboard(request):
    recent = ToolCall.objects.select_related("agent", "channel").order_by("-created_at")[:25]
    pending = ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL)
    if "admin" not in person_roles(request.user):
        pending = pending.filter(channel__operators=request.user)
    pending = pending.count()
    chains = gateway().dashboard.get("chains")
    context = {"recent": recent, "pending": pending, "health": health_report(), "chains": chains() if chains else None}
    return render(request, "dashboard.html", context)


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


def not_found(request, exception=None):
    if _wants_json(request):
        return JsonResponse(error_body("not_found", "No such resource."), status=404)
    return render(request, "error.html", {"title": "Not found", "message": "There is no page here."}, status=404)


def server_error(request):
    if _wants_json(request):
        return JsonResponse(error_body("server_error", "The server failed; the event log is unchanged."), status=500)
    return render(
        request, "error.html", {"title": "Server error", "message": "Something failed on our side."}, status=500
    )
