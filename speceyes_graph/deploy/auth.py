"""No client of a LangGraph server reads or writes the online gate's state, and threads
belong to whoever made them.

The online gate keeps its labels in the server's store so that every worker shares one gate
(:class:`~speceyes_graph.gate.online.OnlineGate`). The server's store API
(``client.store.put_item``, ``search_items``, ``delete_item``) reaches the same store, so
without a rule anyone who can reach the server could read the labels, or write, rewrite and
delete them. The gate's own signatures (:mod:`speceyes_graph.gate.keys`) make fabricated and
rewritten entries count for nothing; this rule also stops deletions and reads, which a
signature cannot. Graph nodes reach the store directly (``runtime.store``), not through the
API, so the gate itself is not affected.

The thread API is the other way in: ``threads.search`` shows every thread's state and
``threads.update_state`` writes any node's. The gate no longer counts anything a client can
write there (:mod:`speceyes_graph.gate.online_steps`), but a thread's questions, images and
answers are its maker's: :func:`owner_scope` is LangGraph's documented pattern, the caller's
identity stamped as ``owner`` metadata on each thread, run and cron it makes, and a filter on
that owner on every read, search, update, delete and run.

- ``auth``: for servers without authentication of their own (``langgraph dev``, a
  self-hosted open server): anyone may call, as before, with the gate's namespace refused to
  all (HTTP 403) and threads scoped to their owner. Every caller of an open server is the
  same ``"anonymous"`` identity, so there any client still sees and writes every thread;
  what that leaves a client is said in docs/deployment.md. The shipped ``langgraph.json``
  names it. On a server configured for LangSmith authentication (LangGraph Platform's
  default) it lets no request in, rather than replace that authentication with none.
- :func:`make_auth`: the same rules over your own ``authenticate`` (identities: tokens, a
  gateway's header), so each caller sees only their own threads.
- :func:`refuse_gate_state` and :func:`owner_scope`: the rules alone, for your own handlers.

Aegra files every client's store items under ``("users", <identity>)``, so a client cannot
name the gate's namespace at all; its threads follow its own auth handlers.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langgraph_sdk import Auth

__all__ = ["GATE_NAMESPACE", "OWNER", "auth", "make_auth", "owner_scope", "refuse_gate_state"]

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


OWNER = "owner"  # the metadata key a thread's maker is kept under


def owner_scope(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
    """LangGraph's owner pattern, for an ``@auth.on.threads`` (or ``crons``) handler: what
    the caller makes carries its identity as ``owner`` metadata, and what it reads,
    searches, updates, deletes or runs on is filtered to that owner. A caller that names
    another owner in its metadata is overwritten."""
    identity = ctx.user.identity
    if isinstance(value, dict):
        metadata = value.get("metadata")
        if not isinstance(metadata, dict):
            metadata = value["metadata"] = {}
        metadata[OWNER] = identity
    return {OWNER: identity}


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


def make_auth(authenticate: Callable[..., Awaitable[Any]] | None = None) -> Auth:
    """The shipped rules over ``authenticate`` (an ``@auth.authenticate`` handler; default:
    anyone, as ``"anonymous"``): the gate's namespace refused in the store, threads and
    crons scoped to their owner, assistants open. Name the result in ``langgraph.json``'s
    ``auth.path``."""
    auth = Auth()
    auth.authenticate(authenticate or _anyone)

    @auth.on
    async def _open(ctx: Auth.types.AuthContext, value: Any) -> None:
        """Assistants and the rest: open, as on a server without authentication."""
        return None

    @auth.on.threads
    async def _threads(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return owner_scope(ctx, value)

    @auth.on.crons
    async def _crons(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return owner_scope(ctx, value)

    @auth.on.store()
    async def _store(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> None:
        refuse_gate_state(value)

    return auth


auth = make_auth()
