"""Chain verification, one entry at a time and resumable: the first break of each kind (docs/ledger-format.md)."""

from __future__ import annotations

from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from .entries import (
    GENESIS,
    HEX64,
    KEY_ACTIONS,
    b64d,
    b64e,
    body_encode,
    entry_digest,
    key_fingerprint,
)

KEY_ENTRIES = ("identity_created", *KEY_ACTIONS)
BREAK_KINDS = (
    "non_canonical",
    "edited",
    "foreign_agent",
    "sequence_gap",
    "out_of_order",
    "broken_link",
    "unknown_signer",
    "bad_signature",
    "truncated",
)


class ChainVerifier:
    """Feed entries in chain order, then `finish()`; `state()` lets a long chain be verified across requests."""

    def __init__(
        self,
        *,
        agent: str,
        listed_keys: dict[str, str],
        expect_heads: list[tuple[int, str]] | None = None,
        state: dict[str, Any] | None = None,
    ):
        self.agent = agent
        self.listed = listed_keys
        self.expect = expect_heads or []
        self._expected_seqs = {seq for seq, _ in self.expect}
        self._verify_keys: dict[str, VerifyKey] = {}
        state = state or {}
        self.count: int = state.get("count", 0)
        self.last_seq: int | None = state.get("last_seq")
        self.last_hash: str | None = state.get("last_hash")
        self.max_seq: int = state.get("max_seq", 0)
        self.active: str | None = state.get("active")
        self.keys: dict[str, str] = state.get("keys", {})
        self.retired: dict[str, str] = state.get("retired", {})
        self.breaks: dict[str, dict[str, Any]] = state.get("breaks", {})
        self.counts: dict[str, int] = state.get("counts", {})
        self.seen: dict[str, str] = state.get("seen", {})
        # Signatures of ordinary entries, checked together in one tight loop (the crypto runs measurably slower
        # interleaved with the parsing) before anything reads the result: state(), finish(), or a key change.
        self._unchecked: list[tuple[int, VerifyKey, bytes, bytes, str]] = []

    def state(self) -> dict[str, Any]:
        self._check_signatures()
        return {
            "count": self.count,
            "last_seq": self.last_seq,
            "last_hash": self.last_hash,
            "max_seq": self.max_seq,
            "active": self.active,
            "keys": self.keys,
            "retired": self.retired,
            "breaks": self.breaks,
            "counts": self.counts,
            "seen": self.seen,
        }

    def _break(self, kind: str, seq: int | None, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind not in self.breaks:
            self.breaks[kind] = {"kind": kind, "seq": seq, "message": message}

    def feed(
        self,
        body: Any,
        hash_: Any,
        signature: Any,
        *,
        exact: bytes | None = None,
        columns: dict[str, Any] | None = None,
    ) -> None:
        """One entry: its parsed body, hash and signature; `exact`: the stored bytes, which must be canonical."""
        self.count += 1
        first = self.count == 1
        seq = body.get("seq") if isinstance(body, dict) and type(body.get("seq")) is int else None
        if seq is None:
            seq = (self.last_seq or 0) + 1
        problem, data = body_encode(body)
        if problem is None and exact is not None and data != exact:
            problem = "the stored bytes are not the RFC 8785 encoding of what they say"
        signature_bytes = b64d(signature, 64)
        if problem is None and not (isinstance(hash_, str) and HEX64.fullmatch(hash_)):
            problem = "hash must be 64 lowercase hex digits"
        if problem is None and signature_bytes is None:
            problem = "signature must be standard base64 of 64 bytes"
        if problem is not None:
            self._break("non_canonical", seq, problem)
            self._advance(seq, hash_ if isinstance(hash_, str) else None)
            return
        digest = entry_digest(data)
        if digest.hex() != hash_:
            self._break("edited", seq, "the hash does not match the entry's canonical bytes: a field was changed")
            digest = bytes.fromhex(hash_)  # the signature is checked against the hash the entry claims
        if columns:
            for name, value in columns.items():
                if body[name] != value:
                    differing = sorted(n for n, v in columns.items() if body[n] != v)
                    self._break("edited", seq, f"the stored index columns {differing} disagree with the signed entry")
                    break
        if body["agent"] != self.agent:
            self._break("foreign_agent", seq, f"the entry belongs to agent {body['agent']!r}, not {self.agent!r}")
        self._check_order(body, seq, first)
        key = self._signer_key(body, seq, first)
        if key is not None and body["action"] in KEY_ENTRIES:
            # A key entry changes who may sign next, so its signature (and every one before it) is checked now.
            self._check_signatures()
            if self._signature_holds(seq, key, digest, signature_bytes, body["signer"]):
                self._key_change(body, seq)
        elif key is not None:
            self._unchecked.append((seq, key, digest, signature_bytes, body["signer"]))
        self._advance(seq, hash_)

    def _signature_holds(self, seq: int, key: VerifyKey, digest: bytes, signature: bytes, signer: str) -> bool:
        try:
            key.verify(digest, signature)
        except BadSignatureError:
            self._break("bad_signature", seq, f"the signature does not verify under key {signer[:16]}…")
            return False
        return True

    def _check_signatures(self) -> None:
        unchecked, self._unchecked = self._unchecked, []
        for entry in unchecked:
            self._signature_holds(*entry)

    def _advance(self, seq: int, hash_: str | None) -> None:
        self.last_seq, self.last_hash = seq, hash_
        self.max_seq = max(self.max_seq, seq)
        if seq in self._expected_seqs:
            self.seen[str(seq)] = hash_

    def _check_order(self, body: dict[str, Any], seq: int, first: bool) -> None:
        expected = 1 if first else self.last_seq + 1
        if seq > expected:
            self._break("sequence_gap", seq, f"seq {seq} follows {expected - 1}: {seq - expected} entries missing")
        elif seq < expected:
            self._break("out_of_order", seq, f"seq {seq} after {expected - 1}: an entry inserted or reordered")
        prev = GENESIS if first else self.last_hash
        if body["prev_hash"] != prev:
            self._break("broken_link", seq, "prev_hash is not the hash of the entry before it")

    def _signer_key(self, body: dict[str, Any], seq: int, first: bool) -> VerifyKey | None:
        signer = body["signer"]
        if body["action"] == "identity_created":
            if not first:
                self._break("unknown_signer", seq, "identity_created may only open a chain")
                return None
            public_key = b64d(body["detail"].get("public_key"), 32)
            if public_key is None or key_fingerprint(public_key) != signer:
                self._break("unknown_signer", seq, "the identity entry's public key is not its signer's")
                return None
            self.keys[signer] = b64e(public_key)
        elif self.active is None:
            self._break("unknown_signer", seq, "no identity_created entry opens this chain")
            return None
        elif signer != self.active:
            why = self.retired.get(signer, "not a key of this chain")
            self._break("unknown_signer", seq, f"signer {signer[:16]}… is {why}")
            return None
        if self.listed.get(signer) != self.keys[signer]:
            self._break("unknown_signer", seq, f"the key list gives {signer[:16]}… another public key than the chain")
            return None
        if signer not in self._verify_keys:
            self._verify_keys[signer] = VerifyKey(b64d(self.keys[signer], 32))
        return self._verify_keys[signer]

    def _key_change(self, body: dict[str, Any], seq: int) -> None:
        action = body["action"]
        if action == "identity_created":
            self.active = body["signer"]
        elif action in KEY_ACTIONS:
            new_key, public_key = body["detail"].get("new_key"), b64d(body["detail"].get("public_key"), 32)
            if public_key is None or key_fingerprint(public_key) != new_key:
                self._break("unknown_signer", seq, "the key entry introduces a key whose fingerprint does not match")
                return
            verb = "revoked" if action == "key_revoked" else "rotated out"
            self.retired[body["signer"]] = f"{verb} at seq {seq}"
            self.keys[new_key] = b64e(public_key)
            self.active = new_key

    def finish(self) -> dict[str, Any]:
        self._check_signatures()
        if self.count == 0:
            self._break("truncated", 1, "the chain has no entries, not even its identity entry")
        for seq, hash_ in self.expect if self.count else []:
            if self.max_seq < seq:
                self._break("truncated", self.max_seq + 1, f"the chain ends at seq {self.max_seq}; expected {seq}")
            elif self.seen.get(str(seq)) != hash_:
                self._break("truncated", seq, f"entry {seq} is not the expected head {seq}:{hash_[:16]}…")
        order = {kind: i for i, kind in enumerate(BREAK_KINDS)}
        breaks = sorted(self.breaks.values(), key=lambda b: (b["seq"] or 0, order[b["kind"]]))
        return {
            "agent": self.agent,
            "ok": not breaks,
            "entries": self.count,
            "head": {"seq": self.last_seq, "hash": self.last_hash} if self.count else None,
            "keys": len(self.keys),
            "active_key": self.active,
            "breaks": breaks,
            "counts": self.counts,
        }
