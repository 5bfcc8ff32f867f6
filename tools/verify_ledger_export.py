#!/usr/bin/env python3
"""Verify an Aleph ledger export offline, as docs/ledger-format.md specifies: standard library, PyNaCl, rfc8785."""

import argparse
import base64
import hashlib
import json
import re
import sys

import rfc8785
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

TAG, ZERO, LIMIT, S, N = b"aleph-ledger/v1\n", "0" * 64, 2**53 - 1, (str,), (str, type(None))
FIELDS = {"v": (int,), "agent": S, "seq": (int,), "time": S, "action": S, "tool": N, "outcome": S, "args_sha256": N}
FIELDS |= {"detail": (dict,), "principal": N, "call": N, "signer": S, "prev_hash": S}
ACTIONS = {"tool_call", "tool_denied", "approval_granted", "approval_denied", "identity_created"}
KEY_ACTIONS, B64 = {"key_rotated", "key_revoked"}, re.compile(r"[A-Za-z0-9+/]*={0,2}")
Dup, Bad = type("Dup", (dict,), {}), type("Bad", (str,), {})  # a repeated key; a float or an integer beyond 2^53
pairs = lambda p: Dup(p) if len(dict(p)) != len(p) else dict(p)  # noqa: E731
integer = lambda s: int(s) if abs(int(s)) <= LIMIT else Bad(s)  # noqa: E731
hex64 = lambda s: isinstance(s, str) and len(s) == 64 and set(s) <= set("0123456789abcdef")  # noqa: E731
sha = lambda raw: hashlib.sha256(raw).hexdigest()  # noqa: E731
kids = lambda v: v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()  # noqa: E731
unclean = lambda v: isinstance(v, Dup | Bad) or any(map(unclean, kids(v)))  # noqa: E731
raw64 = lambda s: base64.b64decode(s) if isinstance(s, str) and len(s) % 4 == 0 and B64.fullmatch(s) else b""  # noqa: E731
b64 = lambda s, size: r if len(r := raw64(s)) == size and base64.b64encode(r).decode() == s else None  # noqa: E731


def verify(doc, expect):
    agent, found, keys, retired, seen = doc.get("agent"), {}, {}, {}, {}
    active, last_seq, last_hash, n = None, None, None, 0
    listed = {k.get("fingerprint"): k.get("public_key") for k in doc.get("keys") or [] if isinstance(k, dict)}
    heads = [(h["seq"], h.get("hash")) for h in [doc.get("head")] if isinstance(h, dict) and type(h.get("seq")) is int]
    # A failed check is a break; the report names the first break of each kind.
    require = lambda ok, kind, seq, m: ok or (found.setdefault(kind, {"kind": kind, "seq": seq, "message": m}) and 0)  # noqa: E731
    for entry in doc.get("entries") or []:
        n, e = n + 1, entry if isinstance(entry, dict) else {}
        body = type(e)((k, v) for k, v in e.items() if k not in ("hash", "signature")) if e else entry
        h, sig = e.get("hash"), b64(e.get("signature"), 64)
        seq = body["seq"] if isinstance(body, dict) and type(body.get("seq")) is int else (last_seq or 0) + 1
        expected, prev = (1, ZERO) if n == 1 else (last_seq + 1, last_hash)
        seen[seq], last_seq, last_hash = h, seq, h if isinstance(h, str) else None
        ok = isinstance(body, dict) and not unclean(body) and set(body) == set(FIELDS) and hex64(h) and sig
        ok = ok and all(type(body[k]) in t for k, t in FIELDS.items()) and body["v"] == 1 and 0 < body["seq"] <= LIMIT
        ok = ok and body["action"] in ACTIONS | KEY_ACTIONS and body["outcome"] in ("ok", "error", "denied")
        try:
            data = rfc8785.dumps(body) if ok and hex64(body["signer"]) and hex64(body["prev_hash"]) else None
        except ValueError:  # a lone surrogate
            data = None
        if not require(data, "non_canonical", seq, "not a well-formed v1 entry (repeated key? float? big integer?)"):
            continue
        require(sha(TAG + data) == h, "edited", seq, "the hash does not match the canonical bytes")
        require(body["agent"] == agent, "foreign_agent", seq, f"the entry belongs to agent {body['agent']!r}")
        require(seq == expected, "sequence_gap" if seq > expected else "out_of_order", seq, f"{expected} due")
        require(body["prev_hash"] == prev, "broken_link", seq, "prev_hash is not the hash of the entry before")
        signer, action, detail = body["signer"], body["action"], body["detail"]
        pk, new = b64(detail.get("public_key"), 32), detail.get("new_key")
        trusted = signer == active and action != "identity_created"
        if action == "identity_created" and n == 1 and pk and sha(pk) == signer:
            keys[signer], trusted = detail["public_key"], True  # the first key: where trust starts
        why = f"{signer[:16]}… is {retired.get(signer, 'not the chain key here')}"
        if not require(trusted and listed.get(signer) == keys.get(signer), "unknown_signer", seq, why):
            continue
        try:
            VerifyKey(b64(keys[signer], 32)).verify(bytes.fromhex(h), sig)
        except BadSignatureError:
            require(False, "bad_signature", seq, "the signature does not verify under the signer's key")
            continue
        if action in KEY_ACTIONS and require(pk and sha(pk) == new, "unknown_signer", seq, "new key ≠ its fingerprint"):
            retired[signer], keys[new], active = f"retired at seq {seq}", detail["public_key"], new
        active = signer if action == "identity_created" else active
    top = max(seen, default=0)
    for seq, hash_ in heads + expect if n else [(1, None)]:
        require(top >= seq and seen.get(seq) == hash_, "truncated", min(seq, top + 1), f"{seq}:{hash_} not reached")
    return {"agent": agent, "ok": not found, "entries": n, "breaks": sorted(found.values(), key=lambda b: b["seq"])}


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("export")
    cli.add_argument("--expect-head", metavar="SEQ:HASH", help="a head an auditor wrote down earlier")
    args = cli.parse_args()
    try:
        with open(args.export, "rb") as f:
            doc = json.loads(f.read(), object_pairs_hook=pairs, parse_float=Bad, parse_int=integer, parse_constant=Bad)
        if type(doc) is not dict or doc.get("format") != "aleph-ledger-export" or doc.get("version") != 1:
            raise ValueError("not an aleph-ledger-export version 1 document")
        expect = [(int(args.expect_head.split(":")[0]), args.expect_head.split(":")[1])] if args.expect_head else []
    except (OSError, ValueError, IndexError) as exc:
        print(f"unreadable export {args.export}: {exc}", file=sys.stderr)
        sys.exit(2)
    report = verify(doc, expect)
    print(json.dumps(report, indent=1, ensure_ascii=False))
    sys.exit(0 if report["ok"] else 1)
