"""The signed entry format of docs/ledger-format.md: fields, canonical bytes, hashes, strict parsing, redaction."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import rfc8785

TAG = b"aleph-ledger/v1\n"
GENESIS = "0" * 64
FORMAT_VERSION = 1
EXPORT_FORMAT = "aleph-ledger-export"
FIELDS = (
    "v",
    "agent",
    "seq",
    "time",
    "action",
    "tool",
    "outcome",
    "args_sha256",
    "detail",
    "principal",
    "call",
    "signer",
    "prev_hash",
)
FIELD_SET = frozenset(FIELDS)
ACTIONS = (
    "tool_call",
    "tool_denied",
    "approval_granted",
    "approval_denied",
    "identity_created",
    "key_rotated",
    "key_revoked",
)
KEY_ACTIONS = ("key_rotated", "key_revoked")
OUTCOMES = ("ok", "error", "denied")
MAX_SAFE_INT = 2**53 - 1
HEX64 = re.compile(r"[0-9a-f]{64}")
SORTED_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)

DETAIL_STRING_CAP = 500
DETAIL_BYTES_CAP = 4096
SECRET_KEY_NAMES = re.compile(r"secret|token|password|passwd|credential|authorization|api[_-]?key|private", re.I)
SECRET_VALUES = re.compile(r"aleph_(?:agent|user)_[A-Za-z0-9_-]{16,}|(?:sk|ghp|xox[bp])[-_][A-Za-z0-9_-]{16,}")


def rfc3339(moment: datetime) -> str:
    """UTC with microseconds and a Z: 2026-01-31T23:59:59.123456Z."""
    text = moment.isoformat(timespec="microseconds")
    if not text.endswith("+00:00"):
        text = moment.astimezone(UTC).isoformat(timespec="microseconds")
    return text[:-6] + "Z"


def parse_rfc3339(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def b64e(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def b64d(text: Any, size: int) -> bytes | None:
    """Standard padded base64 of exactly `size` bytes, or None."""
    if not isinstance(text, str):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == size and b64e(raw) == text else None


def key_fingerprint(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()


def canonical(body: dict[str, Any]) -> bytes:
    return rfc8785.dumps(body)


def entry_digest(canonical_bytes: bytes) -> bytes:
    """SHA-256 over the domain tag and the canonical bytes: the hash, and what the signature signs."""
    return hashlib.sha256(TAG + canonical_bytes).digest()


def arguments_sha256(arguments: Any) -> tuple[str, str]:
    """SHA-256 of the RFC 8785 arguments; arguments RFC 8785 cannot encode fall back to sorted-key JSON (and say so)."""
    try:
        return hashlib.sha256(rfc8785.dumps(arguments)).hexdigest(), "rfc8785"
    except (rfc8785.CanonicalizationError, TypeError, ValueError):
        raw = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest(), "json-sorted"


def _cap(text: str) -> str:
    text = SECRET_VALUES.sub("[redacted]", text)
    if len(text) <= DETAIL_STRING_CAP:
        return text
    return f"{text[:DETAIL_STRING_CAP]}…[+{len(text) - DETAIL_STRING_CAP} chars]"


def _redact(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else str(value)
    if isinstance(value, str):
        return _cap(value.encode("utf-8", "replace").decode("utf-8"))
    if depth >= 4:
        return "[nested too deep]"
    if isinstance(value, dict):
        return {
            _cap(str(k)): "[redacted]" if SECRET_KEY_NAMES.search(str(k)) else _redact(v, depth + 1)
            for k, v in list(value.items())[:50]
        }
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value[:50]]
    return _cap(str(value))


def _keys_ascii(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        children = item.values() if type(item) is dict else item
        if type(item) is dict and not all(key.isascii() for key in item):
            return False
        stack.extend(child for child in children if type(child) is dict or type(child) is list)
    return True


def encode_clean(value: Any) -> bytes:
    """RFC 8785 bytes of a value without floats or unsafe integers (redacted details, our own bodies)."""
    if _keys_ascii(value):
        # Sorted-key JSON is RFC 8785 for objects of ASCII keys, strings, safe integers, booleans and null.
        return SORTED_JSON.encode(value).encode()
    return rfc8785.dumps(value)


def detail_redact(detail: dict[str, Any]) -> dict[str, Any]:
    """Only what RFC 8785 encodes exactly (no floats, safe integers), secrets masked, strings and size capped."""
    cleaned = _redact(detail, 0)
    size = len(encode_clean(cleaned))
    if size > DETAIL_BYTES_CAP:
        return {"truncated": True, "bytes": size}
    return cleaned


# -- strict parsing ---------------------------------------------------------------------------------------------


class Duplicated(dict):
    """An object whose JSON text repeated a key."""


class Inexact(str):
    """A number RFC 8785 cannot carry exactly here: a float, or an integer beyond 2^53."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    return Duplicated(result) if len(result) != len(pairs) else result


def _int(text: str) -> int | Inexact:
    value = int(text)
    return value if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else Inexact(text)


def strict_loads(text: str | bytes) -> Any:
    """JSON where repeated keys and inexact numbers survive as markers for `body_problem` to find."""
    return json.loads(text, object_pairs_hook=_pairs, parse_float=Inexact, parse_int=_int, parse_constant=Inexact)


STORED_JSON = json.JSONDecoder(parse_float=Inexact, parse_constant=Inexact)


def stored_loads(text: str) -> Any:
    """Stored bytes, parsed for comparison with their re-encoding: a repeated key cannot survive that comparison."""
    return STORED_JSON.decode(text)


def _scan(value: Any, keys_ascii: list[bool]) -> str | None:
    """The first repeated key or inexact number inside `value`; clears keys_ascii[0] on a non-ASCII key."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is Duplicated:
            return "a key appears twice"
        if type(item) is dict:
            if keys_ascii[0] and not "".join(item).isascii():
                keys_ascii[0] = False
            children = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind is dict or kind is list or kind is Duplicated:
                stack.append(child)
            elif kind is Inexact:
                return f"number {child} is a float or beyond 2^53"
            elif kind is int and not -MAX_SAFE_INT <= child <= MAX_SAFE_INT:
                return f"number {child} is beyond 2^53"
    return None


FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "v": (int,),
    "agent": (str,),
    "seq": (int,),
    "time": (str,),
    "action": (str,),
    "tool": (str, type(None)),
    "outcome": (str,),
    "args_sha256": (str, type(None)),
    "detail": (dict, Duplicated),
    "principal": (str, type(None)),
    "call": (str, type(None)),
    "signer": (str,),
    "prev_hash": (str,),
}


def body_encode(body: Any) -> tuple[str | None, bytes]:
    """(why this parsed body is not a well-formed v1 entry body, or None; its RFC 8785 bytes when well-formed)."""
    if type(body) is Duplicated:
        return "a key appears twice", b""
    if type(body) is not dict:
        return "an entry must be a JSON object", b""
    if body.keys() != FIELD_SET:
        missing, extra = FIELD_SET - body.keys(), body.keys() - FIELD_SET
        return f"fields differ from v1: missing {sorted(missing)}, unknown {sorted(extra)}", b""
    for name, types in FIELD_TYPES.items():
        if type(body[name]) not in types:
            return f"field {name} has the wrong type", b""
    # The type checks above settle every top-level field but `detail`, whose insides may hold anything.
    keys_ascii = [True]
    problem = _scan(body["detail"], keys_ascii)
    if problem:
        return problem, b""
    if body["v"] != FORMAT_VERSION or body["action"] not in ACTIONS or body["outcome"] not in OUTCOMES:
        return "unknown version, action or outcome", b""
    if not 1 <= body["seq"] <= MAX_SAFE_INT:
        return "seq must be between 1 and 2^53-1", b""
    if not (HEX64.fullmatch(body["signer"]) and HEX64.fullmatch(body["prev_hash"])):
        return "signer and prev_hash must be 64 lowercase hex digits", b""
    try:
        if keys_ascii[0]:
            # Sorted-key JSON is RFC 8785 for objects of ASCII keys, strings, safe integers, booleans and null.
            return None, SORTED_JSON.encode(body).encode()
        return None, rfc8785.dumps(body)
    except (ValueError, UnicodeEncodeError):
        return "the body cannot be encoded as RFC 8785 (a lone surrogate?)", b""
