"""The agents' API: thin views that validate, call one service and serialize."""

from __future__ import annotations

import platform

import django
from adrf.views import APIView as AsyncAPIView
from django.conf import settings
from django.db import connection
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from ..calls import call_payload, call_submit, call_wait
from ..chokepoint.service import CallRejected, canonical_json
from ..gateway import build_request_tool_service, gateway
from ..models import Channel, ToolCall
from ..policy_store import current_policy
from ..services import ApplicationError, person_roles
from . import serializers as s
from .auth import HasRole, IsAgent

ERRORS = {
    400: s.ErrorSerializer,
    401: s.ErrorSerializer,
    403: s.ErrorSerializer,
    404: s.ErrorSerializer,
    413: s.ErrorSerializer,
}


def _validated(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _agent_service(request, channel: str, session: str | None = None):
    principal = request.user
    return build_request_tool_service(
        policy=principal.policy, agent_id=principal.agent.id, channel_name=channel, session_key=session
    )


class ToolListView(APIView):
    permission_classes = [IsAgent]

    @extend_schema(
        parameters=[s.ChannelQuerySerializer],
        responses={200: s.ToolDefinitionSerializer(many=True), **ERRORS},
        summary="The tools this agent may see in a channel (denied tools are absent)",
    )
    def get(self, request):
        query = _validated(s.ChannelQuerySerializer, request.query_params)
        service = _agent_service(request, query["channel"])
        return Response([definition.as_dict() for definition in service.list()])


class ToolDetailView(APIView):
    permission_classes = [IsAgent]

    @extend_schema(
        parameters=[s.ChannelQuerySerializer],
        responses={200: s.ToolDefinitionSerializer, **ERRORS},
        summary="One tool definition",
    )
    def get(self, request, name: str):
        query = _validated(s.ChannelQuerySerializer, request.query_params)
        definition = _agent_service(request, query["channel"]).describe(name)
        if definition is None:
            raise CallRejected("tool_not_found", f"No tool named {name!r} is available here.")
        return Response(definition.as_dict())


class DispatcherFormatNegotiation(DefaultContentNegotiation):
    """Here `?format=` names the dispatcher format (openai, anthropic, mcp), not a renderer as DRF would read it."""

    class settings:
        URL_FORMAT_OVERRIDE = None


class ToolSchemaView(APIView):
    permission_classes = [IsAgent]
    content_negotiation_class = DispatcherFormatNegotiation

    @extend_schema(
        parameters=[s.SchemaQuerySerializer],
        responses={200: OpenApiResponse(description="A list of tool entries in the chosen format."), **ERRORS},
        summary="The dispatcher schema, ready to hand to a model",
    )
    def get(self, request):
        query = _validated(s.SchemaQuerySerializer, request.query_params)
        service = _agent_service(request, query["channel"])
        return Response(service.dispatcher_schema(query["format"]))


class CallCreateView(AsyncAPIView):
    permission_classes = [IsAgent]

    def initial(self, request, *args, **kwargs):
        # adrf runs initial() (authentication) in a worker thread; validating the body and building the turn's
        # service (which may open a session row) in that same thread saves every call a thread hop of its own.
        super().initial(request, *args, **kwargs)
        if request.method != "POST":
            return
        self.body = _validated(s.CallCreateSerializer, request.data)
        if len(canonical_json(self.body["input"])) > settings.ALEPH_MAX_INPUT_BYTES:
            raise ApplicationError(
                f"input is larger than {settings.ALEPH_MAX_INPUT_BYTES} bytes", code="input_too_large", status=413
            )
        self.service = _agent_service(request, self.body["channel"], self.body.get("session"))

    @extend_schema(
        request=s.CallCreateSerializer,
        responses={200: s.CallSerializer, 202: s.CallSerializer, **ERRORS},
        summary="Run a tool call through the chokepoint",
    )
    async def post(self, request):
        body = self.body
        payload, finished = await call_submit(
            service=self.service, tool=body["tool"], raw_input=body["input"], wait=body["wait"]
        )
        return Response(payload, status=200 if finished else 202)


class CallDetailView(AsyncAPIView):
    permission_classes = [IsAgent]

    @extend_schema(
        parameters=[s.CallWaitSerializer],
        responses={200: s.CallSerializer, **ERRORS},
        summary="One of this agent's calls, waiting up to `wait` seconds for it to finish",
    )
    async def get(self, request, call_id):
        query = _validated(s.CallWaitSerializer, request.query_params)
        call = await ToolCall.objects.filter(id=call_id, agent_id=request.user.agent.id).afirst()
        if call is None:
            raise CallRejected("call_not_found", "No such call for this agent.")
        call = await call_wait(call=call, wait=query["wait"])
        return Response(call_payload(call))


class PolicyExplainView(APIView):
    permission_classes = [HasRole]
    roles = ("admin", "operator")

    @extend_schema(
        request=s.ExplainRequestSerializer,
        responses={200: s.ExplainSerializer, **ERRORS},
        summary="The decision and its trace for a call, without running anything",
    )
    def post(self, request):
        body = _validated(s.ExplainRequestSerializer, request.data)
        policy = current_policy()
        agent = next((a for a in policy.agents.values() if a.name == body["agent"]), None)
        if agent is None:
            raise CallRejected("agent_not_found", f"No agent named {body['agent']!r}.")
        if "admin" not in person_roles(request.user):
            operated = Channel.objects.filter(name=body["channel"], operators=request.user).exists()
            if not operated:
                raise CallRejected("channel_not_found", f"You operate no channel named {body['channel']!r}.")
        service = build_request_tool_service(
            policy=policy, agent_id=agent.id, channel_name=body["channel"], session_key=None
        )
        decision, trace = service.explain(body["tool"], body["input"])
        return Response({"decision": decision.as_dict(), "trace": trace})


def health_report() -> dict:
    database = {"vendor": connection.vendor, "ok": True}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # health reports the failure instead of failing itself
        database.update(ok=False, error=str(exc))
    wired = gateway()
    layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    return {
        "status": "ok" if database["ok"] else "degraded",
        "versions": {
            "aleph": settings.SPECTACULAR_SETTINGS["VERSION"],
            "python": platform.python_version(),
            "django": django.get_version(),
        },
        "database": database,
        "channel_layer": {"backend": layer, "redis": bool(settings.REDIS_URL)},
        "sandbox": wired.health.get("sandbox", {"level": None, "status": "not configured"}),
        "mcp_servers": wired.health.get("mcp_servers", []),
        "tools": len(wired.registry),
    }


class HealthView(APIView):
    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(responses={200: s.HealthSerializer}, summary="Versions, database, channel layer, sandbox, MCP")
    def get(self, request):
        return Response(health_report())
