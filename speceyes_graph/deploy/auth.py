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

Assistants are the third: an assistant's context is a run's settings, and a client that
could change a graph's default assistant would change every other caller's runs.
:func:`assistant_scope` gives assistants the owner rule too, leaves the server's own
default assistants unchangeable, and on a server without identities refuses assistant
writes altogether unless the operator opts in. (What a run may set at all, whoever's
assistant it runs, is the deployment's allow-list: :mod:`speceyes_graph.settings`.) Store
items outside the gate's namespace are filed under their caller's identity
(:func:`store_scope`).

- ``auth``: for servers without authentication of their own (``langgraph dev``, Aegra
  without an auth file, a self-hosted open server): anyone may call, as before, with the
  gate's namespace refused to all (HTTP 403), threads scoped to their owner and assistant
  writes refused (``SPECEYES_OPEN_ASSISTANT_WRITES=1`` allows them). Every caller of an
  open server is the same ``"anonymous"`` identity, so there any client still sees and
  writes every thread and store item; what that leaves a client is said in
  docs/deployment.md. The shipped ``langgraph.json`` and ``speceyes serve-config``'s
  ``aegra.json`` name it. On a server configured for LangSmith authentication (LangGraph
  Platform's default) it lets no request in, rather than replace that authentication with
  none.
- :func:`make_auth`: the same rules over your own ``authenticate`` (identities: tokens, a
  gateway's header), so each caller sees only their own threads, assistants and store
  items.
- :func:`refuse_gate_state`, :func:`owner_scope`, :func:`assistant_scope` and
  :func:`store_scope`: the rules alone, for your own handlers.

Aegra files every client's store items under ``("users", <identity>)`` and its assistants by
owner itself; these rules add the refusals.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langgraph_sdk import Auth

__all__ = [
    "ASSISTANT_WRITES_ENV",
    "GATE_NAMESPACE",
    "OWNER",
    "assistant_scope",
    "auth",
    "make_auth",
    "owner_scope",
    "refuse_gate_state",
    "store_scope",
]

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


ASSISTANT_WRITES_ENV = "SPECEYES_OPEN_ASSISTANT_WRITES"
"""Set to ``1`` to let the callers of an open server (no identities) make, change and delete
assistants of their own (they still share them: every caller is the same identity)."""


def assistant_scope(ctx: Auth.types.AuthContext, value: Any, writes: bool) -> Auth.types.FilterType:
    """Assistants as threads are: what a caller makes carries its identity as ``owner``,
    and it changes or deletes only those (a server's default assistants, which it made
    itself, carry none: no client changes the graphs' defaults); it reads and runs its own
    and the server's. ``writes`` False (a server without identities, unless its operator
    opted in) refuses every change: the assistants are the operator's."""
    if ctx.action in ("create", "update", "delete") and not writes:
        raise Auth.exceptions.HTTPException(
            status_code=403,
            detail=(
                "assistants are the operator's on a server without identities: "
                f"set {ASSISTANT_WRITES_ENV}=1 to let callers make their own, or give the "
                "server identities (speceyes_graph.deploy.auth.make_auth)"
            ),
        )
    if ctx.action in ("create", "update"):
        if isinstance(value, dict) and isinstance(value.get("metadata"), dict):
            value["metadata"].pop("created_by", None)  # the server's mark for its own
        return owner_scope(ctx, value)
    if ctx.action == "delete":
        return {OWNER: ctx.user.identity}
    # LangGraph's servers take "$or" (at most two levels); its FilterType does not say so
    mine_or_the_servers: Any = [{OWNER: ctx.user.identity}, {"created_by": "system"}]
    return {"$or": mine_or_the_servers}


def store_scope(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> None:
    """The gate's entries refused (:func:`refuse_gate_state`), and every other item under
    the caller's identity: its namespaces are prefixed with it (LangGraph's documented
    pattern), so one caller neither reads nor overwrites another's. On an open server every
    caller is ``"anonymous"``: they share one prefix."""
    refuse_gate_state(value)
    if ctx.action == "list_namespaces" and value.get("namespace") is None:
        value["namespace"] = ()  # the caller's own namespaces only: not who else stores
    for field in ("namespace", "namespace_prefix"):
        namespace = value.get(field)
        if namespace is not None:
            parts = namespace.split(".") if isinstance(namespace, str) else list(namespace)
            value[field] = (ctx.user.identity, *parts)


def make_auth(
    authenticate: Callable[..., Awaitable[Any]] | None = None,
    *,
    open_assistant_writes: bool | None = None,
) -> Auth:
    """The shipped rules over ``authenticate`` (an ``@auth.authenticate`` handler; default:
    anyone, as ``"anonymous"``): the gate's namespace refused in the store and every other
    store item under its caller's identity, threads, crons and assistants scoped to their
    owner, the server's default assistants unchangeable. Without ``authenticate`` (no
    identities) assistant writes are refused unless ``open_assistant_writes`` (default:
    ``SPECEYES_OPEN_ASSISTANT_WRITES=1``). Name the result in ``langgraph.json``'s (or
    ``aegra.json``'s) ``auth.path``."""
    auth = Auth()
    auth.authenticate(authenticate or _anyone)
    identities = authenticate is not None

    def writes() -> bool:
        if identities:
            return True
        if open_assistant_writes is not None:
            return open_assistant_writes
        return os.environ.get(ASSISTANT_WRITES_ENV, "") == "1"

    @auth.on
    async def _open(ctx: Auth.types.AuthContext, value: Any) -> None:
        """Anything without a rule of its own: open, as on a server without authentication."""
        return None

    @auth.on.assistants
    async def _assistants(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return assistant_scope(ctx, value, writes())

    @auth.on.threads
    async def _threads(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return owner_scope(ctx, value)

    @auth.on.crons
    async def _crons(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return owner_scope(ctx, value)

    @auth.on.store()
    async def _store(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> None:
        store_scope(ctx, value)

    return auth


auth = make_auth()
