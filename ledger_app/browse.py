"""Reading the ledger for people: filtered keyset pages, chain status, one entry in its place, hourly activity."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Substr, TruncHour
from django.utils import timezone
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from .entries import HEX64, TAG, b64d
from .models import AgentKey, ChainHead, ChainVerification, LedgerEntry

LIST_COLUMNS = ("id", "seq", "time", "action", "tool", "outcome", "principal", "signer", "hash", "prev_hash")


@dataclass
class EntryPage:
    rows: list[LedgerEntry]
    older: int | None  # `before=` for the next page back in time
    newer: int | None  # `after=` for the page towards the head


def _filtered(agent_id: int, filters: dict[str, Any]):
    rows = LedgerEntry.objects.filter(agent_id=agent_id)
    for name in ("action", "outcome", "tool", "principal"):
        if filters.get(name):
            rows = rows.filter(**{name: filters[name]})
    if filters.get("since"):
        rows = rows.filter(time__gte=filters["since"])
    if filters.get("until"):
        rows = rows.filter(time__lt=filters["until"])
    return rows


def entries_page(*, agent_id: int, filters: dict[str, Any], with_body: bool = False) -> EntryPage:
    """Newest first; `before`/`after` are seq cursors, so page 1,000 costs what page 1 costs (no OFFSET)."""
    limit = filters.get("limit") or 50
    rows = _filtered(agent_id, filters)
    columns = (*LIST_COLUMNS, "body", "signature") if with_body else LIST_COLUMNS
    if filters.get("after") is not None:
        page = list(rows.filter(seq__gt=filters["after"]).order_by("seq").only(*columns)[: limit + 1])
        has_newer = len(page) > limit
        page = page[:limit][::-1]
        has_older = bool(page) and rows.filter(seq__lt=page[-1].seq).exists()
    else:
        if filters.get("before") is not None:
            rows_before = rows.filter(seq__lt=filters["before"])
        else:
            rows_before = rows
        page = list(rows_before.order_by("-seq").only(*columns)[: limit + 1])
        has_older = len(page) > limit
        page = page[:limit]
        has_newer = bool(page) and filters.get("before") is not None and rows.filter(seq__gt=page[0].seq).exists()
    return EntryPage(
        rows=page,
        older=page[-1].seq if page and has_older else None,
        newer=page[0].seq if page and has_newer else None,
    )


def entry_document(entry: LedgerEntry) -> dict[str, Any]:
    """An entry as the export carries it: the signed fields, then hash and signature."""
    try:
        signed = json.loads(entry.body)
    except ValueError:
        signed = None
    if not isinstance(signed, dict):
        signed = {"unreadable_body": entry.body, "seq": entry.seq}
    return {**signed, "hash": entry.hash, "signature": entry.signature}


def chain_status(verification: ChainVerification | None, head_seq: int) -> dict[str, Any]:
    """The badge: verified (to which seq), broken at seq N, or never verified."""
    if verification is None:
        return {"state": "never", "label": "never verified"}
    if not verification.ok:
        return {
            "state": "broken",
            "label": f"broken at seq {verification.first_break_seq}",
            "checked_at": verification.checked_at,
        }
    label = "verified" if verification.head_seq >= head_seq else f"verified to seq {verification.head_seq}"
    return {"state": "verified", "label": label, "checked_at": verification.checked_at}


def chains_overview() -> list[dict[str, Any]]:
    latest = ChainVerification.objects.filter(agent=OuterRef("agent")).order_by("-id").values("id")[:1]
    heads = ChainHead.objects.select_related("agent", "agent__parent", "key").annotate(last_check=Subquery(latest))
    heads = list(heads.order_by("name"))
    checks = ChainVerification.objects.in_bulk([h.last_check for h in heads if h.last_check])
    return [{"head": head, "status": chain_status(checks.get(head.last_check), head.seq)} for head in heads]


def chain_latest_status(head: ChainHead) -> dict[str, Any]:
    verification = ChainVerification.objects.filter(agent_id=head.agent_id).order_by("-id").first()
    return chain_status(verification, head.seq)


def entry_in_chain(*, head: ChainHead, seq: int) -> dict[str, Any] | None:
    """One entry with what an auditor checks by hand: the exact hashed bytes, the key, its neighbours."""
    entry = LedgerEntry.objects.filter(agent_id=head.agent_id, seq=seq).order_by("id").first()
    if entry is None:
        return None
    key = AgentKey.objects.filter(fingerprint=entry.signer).first()
    neighbours = LedgerEntry.objects.filter(agent_id=head.agent_id)
    previous = neighbours.filter(seq__lt=seq).order_by("-seq").values("seq", "hash").first()
    following = neighbours.filter(seq__gt=seq).order_by("seq").values("seq", "prev_hash").first()
    hashed = TAG + entry.body.encode("utf-8", "surrogatepass")
    signature = b64d(entry.signature, 64)
    signature_ok = False
    if key is not None and signature is not None and HEX64.fullmatch(entry.hash):
        try:
            VerifyKey(b64d(key.public_key, 32)).verify(bytes.fromhex(entry.hash), signature)
            signature_ok = True
        except (BadSignatureError, TypeError, ValueError):
            signature_ok = False
    return {
        "entry": entry,
        "document": entry_document(entry),
        "hashed_text": hashed.decode("utf-8", "replace"),
        "hashed_bytes": len(hashed),
        "hash_ok": hashlib.sha256(hashed).hexdigest() == entry.hash,
        "signature_ok": signature_ok,
        "key": key,
        "key_belongs": key is not None and key.agent_id == head.agent_id,
        "previous": previous,
        "following": following,
        "links_back": (previous or {}).get("hash", "0" * 64) == entry.prev_hash,
        "linked_forward": following is None or following["prev_hash"] == entry.hash,
    }


def activity(*, agent_id: int | None, hours: int = 24, now: datetime | None = None) -> list[dict[str, Any]]:
    """Entries per hour by outcome for the last `hours` hours, oldest first, empty hours included."""
    end = (now or timezone.now()).astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    rows = LedgerEntry.objects.filter(time__gte=start, time__lt=end)
    if agent_id is not None:
        rows = rows.filter(agent_id=agent_id)
    if connection.vendor == "sqlite":
        # SQLite keeps datetimes as 'YYYY-MM-DD HH:MM:SS…' in UTC: the first 13 characters are the hour.
        bucket = Substr("time", 1, 13)
    else:
        bucket = TruncHour("time", tzinfo=UTC)
    counts = rows.annotate(hour=bucket).values("hour", "outcome").annotate(n=Count("id")).order_by()
    found: dict[str, dict[str, int]] = {}
    for row in counts:
        hour = row["hour"]
        label = hour[:13] if isinstance(hour, str) else hour.astimezone(UTC).strftime("%Y-%m-%d %H")
        found.setdefault(label, {})[row["outcome"]] = row["n"]
    buckets = []
    for i in range(hours):
        moment = start + timedelta(hours=i)
        tally = found.get(moment.strftime("%Y-%m-%d %H"), {})
        buckets.append({"start": moment, **{o: tally.get(o, 0) for o in ("ok", "error", "denied")}})
    return buckets
