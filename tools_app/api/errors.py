"""One error shape for the whole API: {"error": {"code", "message", "detail"}}."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from ..chokepoint.service import CallRejected
from ..services import ApplicationError

REJECTION_STATUS = {
    "tool_not_found": status.HTTP_404_NOT_FOUND,
    "channel_not_found": status.HTTP_404_NOT_FOUND,
    "agent_not_found": status.HTTP_404_NOT_FOUND,
    "call_not_found": status.HTTP_404_NOT_FOUND,
    "agent_inactive": status.HTTP_403_FORBIDDEN,
    "invalid_arguments": status.HTTP_400_BAD_REQUEST,
}

DRF_CODES = {
    exceptions.ParseError: "invalid_json",
    exceptions.AuthenticationFailed: "not_authenticated",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ValidationError: "invalid_request",
}


def error_body(code: str, message: str, detail: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "detail": detail or {}}}


def _message(detail) -> str:
    if isinstance(detail, list) and detail:
        return _message(detail[0])
    if isinstance(detail, dict) and detail:
        field, value = next(iter(detail.items()))
        return f"{field}: {_message(value)}"
    return str(detail)


def exception_handler(exc, context):
    if isinstance(exc, CallRejected):
        status_code = REJECTION_STATUS.get(exc.code, status.HTTP_400_BAD_REQUEST)
        return Response(error_body(exc.code, exc.message, exc.detail), status=status_code)
    if isinstance(exc, ApplicationError):
        set_rollback()
        return Response(error_body(exc.code, exc.message, exc.detail), status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("request_too_large", "The request body is too large."), status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if not isinstance(exc, exceptions.APIException):
        return None
    set_rollback()
    headers = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        authenticator = context["request"].authenticators[0] if context["request"].authenticators else None
        if authenticator is not None:
            headers["WWW-Authenticate"] = authenticator.authenticate_header(context["request"])
            exc.status_code = status.HTTP_401_UNAUTHORIZED
    code = DRF_CODES.get(type(exc)) or next((c for t, c in DRF_CODES.items() if isinstance(exc, t)), "error")
    detail = exc.detail if isinstance(exc.detail, dict) else {}
    return Response(error_body(code, _message(exc.detail), detail), status=exc.status_code, headers=headers)


def json_error_page(status_code: int, code: str, message: str):
    def view(request, exception=None):
        return JsonResponse(error_body(code, message), status=status_code)

    return view
