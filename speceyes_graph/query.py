"""Checking a query before any model sees it.

The input comes from whoever calls the graph, possibly a stranger through a server, so it is
validated rather than trusted: types (a bare string is not a list of images), counts (at
most 26 options, labelled A..Z), sizes (the question's length in the model's own tokens
against its context), and every image reference through the image store's policy. A bad
query fails here, alone, with a message that says what to send instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from speceyes_tools.images import ImageStore

from .prompts import format_question
from .settings import Limits
from .state import UNREADABLE, Query

__all__ = ["QueryError", "count_tokens", "question_token_limit", "read_query"]


class QueryError(ValueError):
    """The query itself is malformed or too large."""


def _as_list(name: str, value: Any, limit: int) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise QueryError(
            f"'{name}' must be a list, got {type(value).__name__}"
            + (f" (wrap it: [{value!r:.40}])" if isinstance(value, str) else "")
        )
    if len(value) > limit:
        raise QueryError(f"'{name}' has {len(value)} items; at most {limit} are allowed")
    return list(value)


def _text(name: str, value: str) -> str:
    """``value`` if it can be sent to a model (encodes as UTF-8), else a :class:`QueryError`
    naming the field: a lone surrogate (``"\\ud800"``: half an emoji from a client that split
    UTF-16, or bytes decoded with ``surrogateescape``) would fail deep in a tokenizer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start]
        raise QueryError(
            f"'{name}' is not valid text: character {exc.start} is {bad!r} (U+{ord(bad):04X}), "
            "a lone UTF-16 surrogate, which no model can read; send the text as UTF-8 (a "
            "client that cuts strings by UTF-16 units can split an emoji this way)"
        ) from None
    return value


def count_tokens(model: Any, text: str) -> int:
    """Tokens of ``text`` for ``model``: exact when the model can count (``ChatTransformersVLM``
    uses its tokenizer), else a conservative estimate (one token per three characters)."""
    counter = getattr(model, "count_tokens", None)
    if callable(counter):
        return int(counter(text))
    return math.ceil(len(text) / 3)


def question_token_limit(model: Any, limits: Limits) -> int:
    """``max_question_tokens``, lowered to fit the model's context when it reports one."""
    context = getattr(model, "context_length", None)
    if isinstance(context, int) and context > 0:
        return max(1, min(limits.max_question_tokens, context - limits.context_reserve_tokens))
    return limits.max_question_tokens


def read_query(
    raw: Mapping[str, Any], store: ImageStore, limits: Limits, models: Sequence[Any] = ()
) -> Query:
    """A validated :class:`~speceyes_graph.state.Query` (images interned), or an error."""
    question = raw.get("question")
    if not isinstance(question, str) or not question.strip():
        raise QueryError(f"'question' must be a non-empty string, got {question!r:.60}")
    _text("question", question)
    options = raw.get("options")
    if options is not None:
        options = _as_list("options", options, limits.max_options)
        for i, opt in enumerate(options):
            if isinstance(opt, bool) or not isinstance(opt, (str, int, float)):
                raise QueryError(f"option {i} must be a string, got {type(opt).__name__}")
        options = [_text(f"options[{i}]", str(o)) for i, o in enumerate(options)] or None
    query_id = raw.get("query_id")
    if query_id is not None:
        if isinstance(query_id, bool) or not isinstance(query_id, (str, int)):
            raise QueryError(f"'query_id' must be a string, got {type(query_id).__name__}")
        query_id = _text("query_id", str(query_id)[:256])
    text = format_question(question, options)
    for model in {id(m): m for m in models if m is not None}.values():
        n, limit = count_tokens(model, text), question_token_limit(model, limits)
        if n > limit:
            raise QueryError(
                f"the question is {n} tokens long; this deployment accepts at most {limit} "
                "(question and options)"
            )
    refs = _as_list("images", raw.get("images"), limits.max_images)
    for i, ref in enumerate(refs):
        if isinstance(ref, str):
            _text(f"images[{i}]", ref)
            if ref.startswith(UNREADABLE):  # a pasted image that could not be kept
                raise QueryError(f"images[{i}]: {ref[len(UNREADABLE) :]}")
    images = [store.intern(ref) for ref in refs]
    return Query(question=question, images=images, options=options, query_id=query_id)
