"""The auditors' pages: chains and their status, a chain's entries, one entry, verification with progress, export."""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core import signing
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from tools_app.api.errors import error_body
from tools_app.services import ApplicationError, person_roles

from .browse import activity, chain_latest_status, chains_overview, entries_page, entry_in_chain
from .chart import activity_svg, legend
from .entries import ACTIONS, OUTCOMES
from .models import AgentKey, ChainHead
from .serializers import EntryQuerySerializer
from .services import chain_get, ledger_export, verification_begin, verification_finish, verification_step

PAGE_SIZE = 50
VERIFY_STEP = 2_000
CURSOR_SALT = "ledger.verify.progress"
CURSOR_MAX_AGE = 3600


def auditors_only(view):
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not person_roles(request.user) & {"admin", "auditor"}:
            context = {"title": "Not for you", "message": "The ledger is for auditors and admins."}
            return render(request, "error.html", context, status=403)
        return view(request, *args, **kwargs)

    return wrapper


def _head(agent: str) -> ChainHead:
    try:
        return chain_get(name=agent)
    except ApplicationError:
        raise Http404(f"no ledger for {agent!r}") from None


@auditors_only
def index(request):
    chart = activity_svg(activity(agent_id=None), title="Entries per hour, all chains, last 24 hours")
    return render(request, "ledger/index.html", {"chains": chains_overview(), "chart": chart, "legend": legend()})


@auditors_only
def chain(request, agent):
    head = _head(agent)
    query = EntryQuerySerializer(data=request.GET)
    filters = dict(query.validated_data) if query.is_valid() else {}
    filters["limit"] = min(filters["limit"], PAGE_SIZE * 4) if request.GET.get("limit") and filters else PAGE_SIZE
    page = entries_page(agent_id=head.agent_id, filters=filters)
    kept = {k: v for k, v in request.GET.items() if k not in ("before", "after") and v and query.is_valid()}
    context = {
        "head": head,
        "page": page,
        "filters": {k: request.GET.get(k, "") for k in ("action", "outcome", "tool", "principal", "since", "until")},
        "errors": query.errors if not query.is_valid() else {},
        "kept": kept,
        "actions": ACTIONS,
        "outcomes": OUTCOMES,
        "keys": AgentKey.objects.filter(agent_id=head.agent_id).order_by("id"),
        "status": chain_latest_status(head),
        "chart": activity_svg(
            activity(agent_id=head.agent_id), title=f"Entries per hour of {head.name}, last 24 hours"
        ),
        "legend": legend(),
    }
    return render(request, "ledger/chain.html", context)


@auditors_only
def entry(request, agent, seq):
    head = _head(agent)
    found = entry_in_chain(head=head, seq=seq)
    if found is None:
        raise Http404(f"no entry {seq} in {agent}'s chain")
    return render(request, "ledger/entry.html", {"head": head, **found})


@require_POST
@auditors_only
def verify(request, agent):
    """One step of a verification the page drives: the signed cursor carries the verifier's state between steps."""
    head = _head(agent)
    cursor = request.POST.get("cursor", "")
    if cursor:
        try:
            progress = signing.loads(cursor, salt=CURSOR_SALT, max_age=CURSOR_MAX_AGE)
        except signing.BadSignature:
            return JsonResponse(
                error_body("bad_cursor", "This verification cursor is not ours or too old."), status=400
            )
        if progress.get("agent_id") != head.agent_id:
            return JsonResponse(error_body("bad_cursor", "This cursor belongs to another chain."), status=400)
    else:
        progress = verification_begin(head=head)
    progress, done = verification_step(progress=progress, limit=VERIFY_STEP)
    checked = progress["state"].get("count", 0)
    answer = {"checked": checked, "total": max(progress["total"], checked), "done": done}
    if done:
        answer["report"] = verification_finish(progress=progress, source="page", checked_by=request.user)
    else:
        answer["cursor"] = signing.dumps(progress, salt=CURSOR_SALT, compress=True)
    return JsonResponse(answer)


@auditors_only
def export(request, agent):
    head = _head(agent)
    response = StreamingHttpResponse(ledger_export(head=head), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{head.name}-ledger.json"'
    return response
