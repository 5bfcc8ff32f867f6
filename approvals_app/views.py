"""The operators' pages: live cards, the history of decisions and the standing grants."""

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from tools_app.services import ApplicationError, person_roles

from .models import Status
from .services import approval_visible, grant_revoke, grants_visible

HISTORY_LIMIT = 200


def operators_only(view):
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not person_roles(request.user) & {"admin", "operator"}:
            context = {"title": "Not for you", "message": "Approvals are for operators and admins."}
            return render(request, "error.html", context, status=403)
        return view(request, *args, **kwargs)

    return wrapper


def _operated(user) -> list[str]:
    if user.is_superuser:
        return ["all channels"]
    return list(user.operated_channels.order_by("name").values_list("name", flat=True))


@operators_only
def index(request):
    return render(request, "approvals/index.html", {"tab": "live", "operated": _operated(request.user)})


@operators_only
def history(request):
    decided = approval_visible(person=request.user).exclude(status=Status.PENDING)[:HISTORY_LIMIT]
    return render(request, "approvals/history.html", {"tab": "history", "decided": decided})


@operators_only
def grants(request):
    now = timezone.now()
    visible = grants_visible(person=request.user)
    standing = visible.filter(revoked_at__isnull=True).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    ended = visible.exclude(pk__in=standing.values("pk"))[:HISTORY_LIMIT]
    return render(request, "approvals/grants.html", {"tab": "grants", "standing": standing, "ended": ended})


@require_POST
@operators_only
def grant_revoke_view(request, grant_id):
    grant = grants_visible(person=request.user).filter(pk=grant_id).first()
    if grant is None:
        messages.error(request, "No such grant for you.")
        return redirect("approvals:grants")
    try:
        grant_revoke(grant=grant, person=request.user)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Revoked the grant for {grant.tool} ({grant.agent.name} in {grant.channel.name}).")
    return redirect("approvals:grants")
