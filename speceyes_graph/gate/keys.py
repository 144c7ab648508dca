"""The keys an online gate signs its shared entries with, so that it counts only what a gate
of the same deployment wrote.

A LangGraph store is reachable through the server's API (``client.store.put_item``) by
anyone who can reach the server, unless an auth rule denies it
(:mod:`speceyes_graph.deploy.auth`). An entry carries an HMAC-SHA256 over the gate's
namespace, the entry's key and every field, made with a secret only the deployment's workers
hold (``SPECEYES_GATE_KEY``): an entry a client fabricated, or a real one it rewrote or
moved to another key, does not verify and is skipped. What a signature cannot prove is that
an entry is still there, or is its key's latest version: deletions and the replay of an
entry's earlier version are what the auth rule (or Aegra's per-user namespaces) prevents.

Rotation: ``SPECEYES_GATE_KEY="new,old"`` signs with the first and accepts all; drop the old
one once every worker has the new one and a window of traffic has passed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ENV", "GateKeys", "MissingGateKey"]

ENV = "SPECEYES_GATE_KEY"
MIN_LENGTH = 16  # characters: `secrets.token_hex(32)` gives 64


class MissingGateKey(ValueError):
    """A gate was asked to share a store without a key to sign its entries."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}: the online gate signs what it writes to a shared store, so that entries "
            f"written by anyone else are ignored; set {ENV} to the same secret on every worker "
            "(python -c 'import secrets; print(secrets.token_hex(32))'), or pass "
            "trust=TrustOptions(key=...) to OnlineGate"
        )


class GateKeys:
    """One or more secrets: the first signs, any verifies (a key being rotated out)."""

    def __init__(self, keys: str | bytes | Sequence[str | bytes]) -> None:
        listed = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        secrets = [k.encode() if isinstance(k, str) else bytes(k) for k in listed]
        secrets = [k.strip() for k in secrets if k.strip()]
        if not secrets:
            raise ValueError("no gate key given")
        short = [k for k in secrets if len(k) < MIN_LENGTH]
        if short:
            raise ValueError(
                f"a gate key must be at least {MIN_LENGTH} characters (got {len(short[0])}): "
                "python -c 'import secrets; print(secrets.token_hex(32))'"
            )
        self._by_id = {_key_id(k): k for k in secrets}
        self._signing_id = _key_id(secrets[0])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GateKeys | None:
        """``SPECEYES_GATE_KEY`` (comma-separated for rotation), or None when unset."""
        value = (os.environ if environ is None else environ).get(ENV, "")
        return cls(value.split(",")) if value.strip() else None

    def sign(self, namespace: Sequence[str], key: str, fields: Mapping[str, Any]) -> str:
        """``"<key id>:<hex>"``; ``fields`` hold JSON scalars only."""
        digest = _mac(self._by_id[self._signing_id], namespace, key, fields)
        return f"{self._signing_id}:{digest}"

    def verify(
        self, namespace: Sequence[str], key: str, fields: Mapping[str, Any], mac: object
    ) -> bool:
        if not isinstance(mac, str) or mac.count(":") != 1:
            return False
        key_id, digest = mac.split(":")
        secret = self._by_id.get(key_id)
        if secret is None:
            return False
        return hmac.compare_digest(digest, _mac(secret, namespace, key, fields))

    def __repr__(self) -> str:  # never the secrets themselves
        return f"GateKeys(ids={list(self._by_id)}, signing={self._signing_id!r})"


def _key_id(secret: bytes) -> str:
    """A short name for a key, so a verifier picks the right one; reveals nothing of it."""
    return hashlib.sha256(b"speceyes-gate-key-id\0" + secret).hexdigest()[:8]


def _mac(secret: bytes, namespace: Sequence[str], key: str, fields: Mapping[str, Any]) -> str:
    # one canonical text whichever store kept the entry (PostgreSQL's JSONB reorders keys
    # and rewrites number text; a float's repr reads back as the same float)
    message = json.dumps(
        [list(namespace), key, dict(fields)],
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
    )
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()
