"""The stored allow list: read per policy version, edited in the admin console or as `[network]` in aleph.toml."""

from __future__ import annotations

import threading
from typing import Any

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..models import NetworkAllow
from ..policy_store import policy_version
from ..policy_toml import PolicyFileError, Section, section_register
from .guard import AllowList, allow_entry_parse

_lock = threading.Lock()
_cached: tuple[str, AllowList] | None = None


def network_allow_current() -> AllowList:
    """One indexed read of the policy version per call; the rows are read again only when it changed."""
    global _cached
    version = policy_version()
    cached = _cached
    if cached is not None and cached[0] == version:
        return cached[1]
    with _lock:
        allow = AllowList.parse(NetworkAllow.objects.values_list("entry", flat=True), skip_invalid=True)
        _cached = (version, allow)
        return allow


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    entry: str = Field(min_length=1, max_length=300)
    note: str = Field(default="", max_length=500)


class NetworkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    allow: list[str | _Item] = Field(default_factory=list)


@transaction.atomic
def network_allow_replace(*, entries: list[tuple[str, str]]) -> dict[str, int]:
    """Make the stored allow list exactly `entries` (entry, note), keeping rows that did not change."""
    wanted = dict(entries)
    existing = {row.entry: row for row in NetworkAllow.objects.all()}
    removed = [row.pk for entry, row in existing.items() if entry not in wanted]
    NetworkAllow.objects.filter(pk__in=removed).delete()
    for entry, note in wanted.items():
        row = existing.get(entry)
        if row is None:
            NetworkAllow.objects.create(entry=entry, note=note)
        elif row.note != note:
            row.note = note
            row.save(update_fields=["note", "changed_at"])
    return {"entries": len(wanted), "removed": len(removed)}


def network_section_apply(value: Any) -> None:
    try:
        spec = NetworkSpec.model_validate(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in ("network", *error["loc"]))
        raise PolicyFileError(f"{where}: {error['msg']}", None) from None
    entries = []
    for i, item in enumerate(spec.allow):
        entry, note = (item, "") if isinstance(item, str) else (item.entry, item.note)
        try:
            allow_entry_parse(entry)
        except ValueError as exc:
            raise PolicyFileError(f"network.allow.{i}: {exc}", None) from None
        entries.append((entry.strip(), note))
    network_allow_replace(entries=entries)


def network_section_export() -> dict[str, Any]:
    rows = NetworkAllow.objects.order_by("entry")
    allow = [{"entry": row.entry, "note": row.note} if row.note else row.entry for row in rows]
    return {"allow": allow} if allow else {}


section_register(Section("network", network_section_apply, network_section_export))
