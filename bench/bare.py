"""The bench-only baseline: a bare DRF view with the agents' Bearer authentication that writes one row."""

from django.urls import include, path
from rest_framework.response import Response
from rest_framework.views import APIView

from aleph_site.urls import handler404, handler500  # noqa: F401  (the site's error pages stay in place)
from tools_app.api.auth import BearerTokenAuthentication, IsAgent
from tools_app.models import Note


class BareWriteView(APIView):
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [IsAgent]

    def post(self, request):
        note = Note.objects.create(agent_id=request.user.agent.id, text=str(request.data.get("text", "bare")))
        return Response({"id": note.id}, status=201)


urlpatterns = [
    path("bench/bare/", BareWriteView.as_view(), name="bench-bare"),
    path("", include("aleph_site.urls")),
]
