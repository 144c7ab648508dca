"""One node body for both ``invoke`` and ``ainvoke``.

A graph served at scale is a client: a thousand queries in flight should be a thousand
suspended coroutines waiting on sockets, not a thousand threads. LangGraph picks a node's
async implementation under ``ainvoke``/``abatch``/``astream`` and in the server, and its sync
one under ``invoke``/``batch``, but only if the node has both; writing every node twice
would let the two drift apart.

So a node that waits on something is written once, as a generator that *yields* what it
needs done and is sent the result::

    reply = yield ModelCall(model, messages, what="judge", timeout=30.0)

:func:`node` turns it into a LangGraph node with both implementations. The sync driver
performs each request in the calling thread (``model.invoke`` under
:func:`~speceyes_tools.deadlines.call_with_deadline`); the async driver awaits it
(``model.ainvoke`` under :func:`~speceyes_tools.deadlines.acall_with_deadline`, blocking work
in a worker thread). Everything between the requests is the same code on both paths, which
is why ``batch`` and ``abatch`` return the same results. A request that fails is raised at
the ``yield``, so a node's own ``try``/``except`` sees it as it would a direct call.

Nodes that never wait are plain functions; :func:`node` gives them an async form that runs
them inline rather than in LangGraph's default thread pool (a thread hop per node).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from langchain_core.runnables import Runnable

from speceyes_tools.deadlines import (
    DeadlineExceeded,
    acall_with_deadline,
    call_with_deadline,
    start_in_background,
    to_worker_thread,
)

from ._compat import RunnableCallable  # LangGraph's node runnable: sync and async in one

__all__ = [
    "Background",
    "Blocking",
    "Collect",
    "ModelCall",
    "Request",
    "Steps",
    "Subgraph",
    "arun_steps",
    "node",
    "router",
    "run_steps",
    "unavailable",
]

Steps = Generator["Request", Any, Any]


class Request:
    """Something a node waits for; performed by :func:`run_steps` or :func:`arun_steps`."""

    def run(self) -> Any:
        raise NotImplementedError

    async def arun(self) -> Any:
        raise NotImplementedError


@dataclass
class ModelCall(Request):
    """A chat model call within ``timeout`` seconds and the query's deadline.

    ``inline``: the model honours deadlines itself (``ChatTransformersVLM``), so the sync
    path needs no watchdog thread."""

    model: Any
    messages: list
    what: str
    timeout: float | None = None
    inline: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self) -> Any:
        return call_with_deadline(
            self.model.invoke, self.messages, timeout=self.timeout, what=self.what,
            inline=self.inline, **self.kwargs,
        )  # fmt: skip

    async def arun(self) -> Any:
        return await acall_with_deadline(
            self.model.ainvoke, self.messages, timeout=self.timeout, what=self.what,
            inline=self.inline, **self.kwargs,
        )  # fmt: skip


@dataclass
class Blocking(Request):
    """CPU or disk work (decoding images, resizing, encoding, a sync tool): run in place by
    the sync driver, in a worker thread by the async one so the event loop keeps serving
    the other queries (the oldest query's work first:
    :func:`~speceyes_tools.deadlines.to_worker_thread`)."""

    fn: Callable[..., Any]
    args: tuple = ()
    # True when the work is only lookups now (the images it needs already resized): then
    # the async driver runs it in place, since a thread hop would cost more than the work
    ready: Callable[[], bool] | None = None

    def run(self) -> Any:
        return self.fn(*self.args)

    async def arun(self) -> Any:
        if self.ready is not None and self.ready():
            return self.fn(*self.args)
        return await to_worker_thread(self.fn, *self.args)


@dataclass
class Subgraph(Request):
    """A compiled graph run as part of a node (the agent loop, the chat front's query),
    in ``context`` if given (a copy of the caller's with other ambient config).

    ``what``: the run is bounded by the query's deadline, as a model call is, and named so
    in the error (for graphs that do not bound themselves: a user's agent)."""

    graph: Runnable
    input: Any
    config: Any = None
    context: contextvars.Context | None = None
    what: str | None = None

    def run(self) -> Any:
        if self.what is not None:
            return call_with_deadline(
                self.graph.invoke, self.input, self.config, timeout=None, what=self.what
            )
        if self.context is None:
            return self.graph.invoke(self.input, self.config)
        return self.context.run(self.graph.invoke, self.input, self.config)

    async def arun(self) -> Any:
        if self.what is not None:
            return await acall_with_deadline(
                self.graph.ainvoke, self.input, self.config, timeout=None, what=self.what
            )
        run = self.graph.ainvoke(self.input, self.config)
        if self.context is None:
            return await run
        if sys.version_info >= (3, 11):
            return await asyncio.create_task(run, context=self.context)
        # Python 3.10 has no context= argument: a task started inside the context runs in a
        # copy of it (taken now, with the ambient config this request carries)
        return await self.context.run(asyncio.create_task, run)


@dataclass
class Background(Request):
    """Start other steps beside this node; the result is a handle for :class:`Collect`:
    a ``concurrent.futures.Future`` (sync: a reused daemon thread) or an ``asyncio.Task``."""

    steps: Steps

    def run(self) -> Future:
        return start_in_background(run_steps, self.steps)

    async def arun(self) -> asyncio.Task:
        return asyncio.ensure_future(arun_steps(self.steps))


@dataclass
class Collect(Request):
    """The result of a :class:`Background` handle, waiting at most ``timeout`` seconds
    (``TimeoutError`` after that; the background work is left running)."""

    handle: Future | asyncio.Future
    timeout: float | None = None

    def run(self) -> Any:
        if isinstance(self.handle, asyncio.Future):
            raise RuntimeError("an async run's background work cannot be collected by a sync run")
        return self.handle.result(timeout=self.timeout)

    async def arun(self) -> Any:
        handle = self.handle
        if not isinstance(handle, asyncio.Future):
            handle = asyncio.wrap_future(handle)
        return await asyncio.wait_for(asyncio.shield(handle), self.timeout)


def run_steps(steps: Steps) -> Any:
    """Drive a node's steps synchronously; return what the generator returns."""
    try:
        request = next(steps)
        while True:
            try:
                result = request.run()
            except Exception as exc:  # raised at the yield, where the node can handle it
                request = steps.throw(exc)
            else:
                request = steps.send(result)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()


async def arun_steps(steps: Steps) -> Any:
    """Drive a node's steps asynchronously; return what the generator returns."""
    try:
        request = next(steps)
        while True:
            try:
                result = await request.arun()
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(result)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()


def node(fn: Callable[..., Any], *, name: str | None = None) -> Runnable:
    """A graph node with sync and async implementations from one function: a generator of
    :class:`Request` s (see the module docstring) or a plain function that never waits.
    Its parameters are injected as LangGraph injects a function node's (``config``,
    ``runtime``...)."""
    func: Callable[..., Any]
    if inspect.isgeneratorfunction(fn):

        @wraps(fn)
        def func(*args: Any, **kwargs: Any) -> Any:
            return run_steps(fn(*args, **kwargs))

        @wraps(fn)
        async def afunc(*args: Any, **kwargs: Any) -> Any:
            return await arun_steps(fn(*args, **kwargs))

    else:
        func = fn

        @wraps(fn)
        async def afunc(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    return RunnableCallable(func, afunc, name=name or fn.__name__, trace=False)


def router(fn: Callable[..., Any]) -> Runnable:
    """A conditional edge's function, run inline under ``ainvoke`` too (traced, as LangGraph
    traces routers)."""

    @wraps(fn)
    async def afunc(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return RunnableCallable(fn, afunc, name=fn.__name__, trace=False)


def unavailable(exc: BaseException) -> bool:
    """Whether a model call's failure says the model is down rather than that the request
    was its own trouble: it could not be reached (a connection or transport error), did not
    answer within its call's timeout, or answered with a server error (HTTP 5xx), here or in
    the chain of causes (an OpenAI client's ``APIConnectionError`` wraps httpx's). The
    query's own deadline passing, an HTTP 4xx and a malformed reply are the request's: an
    online gate learns nothing from them, where an agent that is down tightens it."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DeadlineExceeded):
            return False
        if isinstance(cause, (ConnectionError, TimeoutError)) or _transport_error(cause):
            return True
        status = getattr(cause, "status_code", None)
        if status is None:
            status = getattr(getattr(cause, "response", None), "status_code", None)
        if isinstance(status, int):
            return status >= 500
        cause = cause.__cause__ or cause.__context__
    return False


def _transport_error(exc: BaseException) -> bool:
    """httpx's transport errors, and OpenAI's client's, which it raises with or without
    httpx's as the cause (a module not imported raised nothing)."""
    httpx, openai = sys.modules.get("httpx"), sys.modules.get("openai")
    return (httpx is not None and isinstance(exc, httpx.TransportError)) or (
        openai is not None and isinstance(exc, openai.APIConnectionError)
    )
