"""No client of a LangGraph server reads or writes the online gate's state.

The online gate keeps its labels in the server's store so that every worker shares one gate
(:class:`~speceyes_graph.gate.online.OnlineGate`). The server's store API
(``client.store.put_item``, ``search_items``, ``delete_item``) reaches the same store, so
without a rule anyone who can reach the server could read the labels, or write, rewrite and
delete them. The gate's own signatures (:mod:`speceyes_graph.gate.keys`) make fabricated and
rewritten entries count for nothing; this rule also stops deletions and reads, which a
signature cannot. Graph nodes reach the store directly (``runtime.store``), not through the
API, so the gate itself is not affected.

- ``auth``: for servers without authentication of their own (``langgraph dev``, a
  self-hosted open server): anyone may call, as before, and the gate's namespace is refused
  to all (HTTP 403). The shipped ``langgraph.json`` names it. On a server configured for
  LangSmith authentication (LangGraph Platform's default) it lets no request in, rather than
  replace that authentication with none: use your own handler there.
- :func:`refuse_gate_state`: the rule alone, for your own ``@auth.on.store()`` handler.

Aegra needs neither: it files every client's store items under ``("users", <identity>)``,
so a client cannot name the gate's namespace at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph_sdk import Auth

__all__ = ["GATE_NAMESPACE", "auth", "refuse_gate_state"]

GATE_NAMESPACE = ("speceyes", "online_gate")


def _overlaps(namespace: Sequence[str]) -> bool:
    """Whether a namespace (or a search's prefix) reaches into the gate's: one is a prefix
    of the other."""
    n = min(len(namespace), len(GATE_NAMESPACE))
    return tuple(namespace[:n]) == GATE_NAMESPACE[:n]


def refuse_gate_state(value: Mapping[str, Any]) -> None:
    """Raise HTTP 403 if a store request (the ``value`` a store handler receives, as
    LangGraph's servers and Aegra pass it) would read or write the gate's entries: a put,
    get or delete in its namespace, or a search whose prefix covers it (the empty prefix
    too). Listing namespaces returns names only, and is allowed.

    Call it first in your own handler::

        @auth.on.store()
        async def store(ctx, value):
            refuse_gate_state(value)
            ...
    """
    for field in ("namespace", "namespace_prefix"):
        namespace = value.get(field)
        if namespace is None:
            continue
        if isinstance(namespace, str):
            namespace = namespace.split(".")
        if _overlaps(list(namespace)):
            raise Auth.exceptions.HTTPException(
                status_code=403,
                detail="the online gate's state is not readable or writable through the API",
            )


auth = Auth()


@auth.authenticate
async def _anyone(headers: Mapping[bytes, bytes]) -> Auth.types.MinimalUserDict:
    """Anyone, as on a server without authentication; never on one set up for LangSmith's."""
    if os.environ.get("LANGGRAPH_AUTH_TYPE", "noop") != "noop":
        raise Auth.exceptions.HTTPException(
            status_code=401,
            detail=(
                "speceyes_graph.deploy.auth:auth is for servers without authentication; this "
                "one is set up for LANGGRAPH_AUTH_TYPE="
                f"{os.environ.get('LANGGRAPH_AUTH_TYPE')}: use your own auth and call "
                "speceyes_graph.deploy.auth.refuse_gate_state in its store handler"
            ),
        )
    return {"identity": "anonymous"}


@auth.on
async def _open(ctx: Auth.types.AuthContext, value: Any) -> None:
    """Threads, runs, assistants, crons: open, as on a server without authentication."""
    return None


@auth.on.store()
async def _store(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> None:
    refuse_gate_state(value)
