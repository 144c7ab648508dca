"""Parallel speculation's bookkeeping: drafts started beside the judge, by ticket.

With ``speculation="parallel"`` the judge node starts the query's draft before it calls the
large model; ``speculate`` collects it, or the judge abandons it when it asks for tools.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future

from ..effects import Background, Steps
from ..models.batching import CancelScope

__all__ = ["StartedDrafts"]


class StartedDrafts:
    """Drafts started by the judge node (parallel speculation), by ticket, until ``speculate``
    takes them or the judge abandons them. Only the ticket goes into graph state; a run
    resumed elsewhere finds no draft under it and simply drafts again. Bounded, so tickets
    of runs that never came back (interrupted, failed) cannot pile up.

    A draft runs on a reused thread under ``invoke`` and as an asyncio task under
    ``ainvoke``; either way its model requests are in a :class:`CancelScope`."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._started: OrderedDict[str, tuple[Future | asyncio.Future, CancelScope]] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, steps: Steps) -> Steps:
        """Start the draft's steps beside the caller; the ticket (``yield from``)."""
        scope = CancelScope()
        handle = yield Background(_in_scope(scope, steps))
        if isinstance(handle, asyncio.Future):  # an abandoned draft's error is nobody's
            handle.add_done_callback(lambda task: task.cancelled() or task.exception())
        ticket = uuid.uuid4().hex
        with self._lock:
            self._started[ticket] = (handle, scope)
            while len(self._started) > self.limit:
                _, (old, old_scope) = self._started.popitem(last=False)
                _cancel(old, old_scope)
        return ticket

    def take(self, ticket: str | None) -> Future | asyncio.Future | None:
        with self._lock:
            started = self._started.pop(ticket, None) if ticket else None
        return None if started is None else started[0]

    def abandon(self, ticket: str | None) -> str | None:
        """Cancel a draft still queued, discard one that ran; say which."""
        with self._lock:
            started = self._started.pop(ticket, None) if ticket else None
        if started is None:
            return None
        handle, scope = started
        if handle.done():
            return "drafted beside the judge, discarded: the judge asked for tools"
        if _cancel(handle, scope):
            return "drafted beside the judge, cancelled before it ran: the judge asked for tools"
        return "drafted beside the judge, discarded while it ran: the judge asked for tools"


def _in_scope(scope: CancelScope, steps: Steps) -> Steps:
    with scope.active():
        return (yield from steps)


def _cancel(handle: Future | asyncio.Future, scope: CancelScope) -> bool:
    """Withdraw a draft's queued requests (True if none reached the model); an asyncio
    draft is cancelled outright as well, which closes a served model's request."""
    before_it_ran = scope.cancel()
    if isinstance(handle, asyncio.Future):
        handle.cancel()
    return before_it_ran
