"""The approvals REST API: operators list and decide their channels' requests; agents never."""

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from tools_app.api.auth import HasRole
from tools_app.api.serializers import ErrorSerializer

from .serializers import ApprovalCardSerializer, ApprovalQuerySerializer, DecideSerializer
from .services import approval_card, approval_decide, approval_find, approval_list

ERRORS = {code: ErrorSerializer for code in (400, 401, 403, 404)}


def _validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class ApprovalListView(APIView):
    permission_classes = [HasRole]
    roles = ("admin", "operator")

    @extend_schema(
        parameters=[ApprovalQuerySerializer],
        responses={200: ApprovalCardSerializer(many=True), **ERRORS},
        summary="The approval requests this person may decide (admins: all), newest first",
    )
    def get(self, request):
        query = _validated(ApprovalQuerySerializer, request.query_params)
        return Response([approval_card(r) for r in approval_list(person=request.user, status=query.get("status"))])


class ApprovalDetailView(APIView):
    permission_classes = [HasRole]
    roles = ("admin", "operator")

    @extend_schema(responses={200: ApprovalCardSerializer, **ERRORS}, summary="One approval request")
    def get(self, request, request_id):
        return Response(approval_card(approval_find(person=request.user, request_id=request_id)))


class ApprovalDecideView(APIView):
    permission_classes = [HasRole]
    roles = ("admin", "operator")

    @extend_schema(
        request=DecideSerializer,
        responses={200: ApprovalCardSerializer, 409: ErrorSerializer, **ERRORS},
        summary="Decide a request: the first decision wins, later ones get 409 with who decided",
    )
    def post(self, request, request_id):
        body = _validated(DecideSerializer, request.data)
        decided = approval_decide(
            request=approval_find(person=request.user, request_id=request_id), operator=request.user, **body
        )
        return Response(approval_card(decided))
