"""The auditors' ledger API: a chain's entries, its verification report and its offline-verifiable export."""

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from tools_app.api.auth import HasRole
from tools_app.api.serializers import ErrorSerializer

from .browse import entries_page, entry_document
from .serializers import EntryPageSerializer, EntryQuerySerializer, VerifyQuerySerializer, VerifyReportSerializer
from .services import chain_get, ledger_export, ledger_verify, parse_expected_head

ERRORS = {code: ErrorSerializer for code in (400, 401, 403, 404)}
AUDITORS = ("admin", "auditor")


def _validated(serializer_class, data) -> dict:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class LedgerEntriesView(APIView):
    permission_classes = [HasRole]
    roles = AUDITORS

    @extend_schema(
        parameters=[EntryQuerySerializer],
        responses={200: EntryPageSerializer, **ERRORS},
        summary="A page of an agent's chain, newest first, filtered; `next` and `previous` are keyset links",
    )
    def get(self, request, agent: str):
        filters = _validated(EntryQuerySerializer, request.query_params)
        head = chain_get(name=agent)
        page = entries_page(agent_id=head.agent_id, filters=filters, with_body=True)
        base = {k: v for k, v in request.query_params.items() if k not in ("before", "after")}

        def link(**cursor) -> str:
            query = request.query_params.copy()
            query.clear()
            query.update({**base, **{k: str(v) for k, v in cursor.items()}})
            return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

        return Response(
            {
                "agent": head.name,
                "results": [entry_document(entry) for entry in page.rows],
                "next": link(before=page.older) if page.older else None,
                "previous": link(after=page.newer) if page.newer else None,
            }
        )


class LedgerVerifyView(APIView):
    permission_classes = [HasRole]
    roles = AUDITORS

    @extend_schema(
        parameters=[VerifyQuerySerializer],
        responses={200: VerifyReportSerializer, **ERRORS},
        summary="Verify the chain now: the first break of each kind (the result also updates the chain's badge)",
    )
    def get(self, request, agent: str):
        query = _validated(VerifyQuerySerializer, request.query_params)
        head = chain_get(name=agent)
        expect = parse_expected_head(query.get("expect_head"))
        return Response(ledger_verify(head=head, expect_head=expect, source="api", checked_by=request.user))


class LedgerExportView(APIView):
    permission_classes = [HasRole]
    roles = AUDITORS

    @extend_schema(
        responses={
            200: OpenApiResponse(description="The export document of docs/ledger-format.md (application/json)."),
            **ERRORS,
        },
        summary="The self-contained, offline-verifiable export of an agent's chain",
    )
    def get(self, request, agent: str):
        head = chain_get(name=agent)
        response = StreamingHttpResponse(ledger_export(head=head), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{head.name}-ledger.json"'
        return response
