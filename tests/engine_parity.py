"""The graph on a serving engine against the transformers path, query by query.

Shared by the engine tests (``test_vllm.py``, ``test_sglang.py``): the same demo queries and
configuration run on both paths must give the same routes, answers, agent turns and scored
tokens, per-token separability within 1e-3, and the same prompt length for every model call.
The local runs are kept for the session, so each configuration runs locally once.

SpecEyes runs all 60 queries, which make every kind of model call the other configurations
make (judge, draft, agent turns with and without the zoom tool, depth-1 tool drafts). Agent-only
and SpecReason, whose runs take longest, check how their mode wires those calls over the
engine; a wrong prompt, stop or log-prob there differs on every query of its kind, so their
first 20 queries (7 of them needing the zoom) fail on it as surely as 60.
"""

from __future__ import annotations

import numpy as np
from langchain_core.callbacks import BaseCallbackHandler

from speceyes_graph import SpeculationOptions, create_speceyes_graph
from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_queries

N = 60  # demo queries, a third of them needing the zoom tool
CONFIGURATIONS = {  # name: (mode, graph settings, how many of the queries)
    "speceyes": ("speceyes", {}, N),
    "agent": ("agent", {}, 20),
    "small": ("small", {}, N),
    "specreason": ("specreason", {}, 20),
    "speceyes-parallel": ("speceyes", {"speculation": "parallel"}, N),
    "speceyes-depth1": ("speceyes", {"speculation": SpeculationOptions(depth=1)}, N),
}
_LOCAL_RUNS: dict = {}


def demo_inputs(folder):
    return [
        {"question": q.question, "images": [q.image], "options": q.options}
        # without micro queries: the small model is unsure of them by design, and an answer
        # whose top two logits nearly tie is decided by rounding, not by the engine
        for q in demo_queries(folder, N, micro_share=0.0)
    ]


class PromptTokens(BaseCallbackHandler):
    """(call name, prompt length) of every model call of one query, as the engine reports it."""

    def __init__(self):
        self.names: dict = {}
        self.counts: list[tuple[str, int]] = []

    def on_chat_model_start(self, serialized, messages, *, run_id, name=None, **kwargs):
        self.names[run_id] = name or "?"

    def on_llm_end(self, response, *, run_id, **kwargs):
        for generations in response.generations:
            for g in generations:
                usage = getattr(getattr(g, "message", None), "usage_metadata", None) or {}
                self.counts.append(
                    (self.names.get(run_id, "?"), int(usage.get("input_tokens", -1)))
                )


def run(models, mode, queries, **settings):
    """(outputs, sorted prompt lengths of each query's model calls)."""
    graph = create_speceyes_graph(
        speculator=models["small"], agent=models["large"], mode=mode,
        **DEMO_GRAPH_SETTINGS, **settings,
    )  # fmt: skip
    handlers = [PromptTokens() for _ in queries]
    outs = graph.compile().batch(
        queries, [{"callbacks": [h], "max_concurrency": 64} for h in handlers]
    )
    return outs, [sorted(h.counts) for h in handlers]


def run_configuration(models, configuration, queries):
    """``run`` of a named configuration, on its share of ``queries``."""
    mode, settings, n = CONFIGURATIONS[configuration]
    return run(models, mode, queries[:n], **settings)


def assert_same(local_run, served_run):
    (lo, l_tokens), (so, s_tokens) = local_run, served_run
    assert len(lo) == len(so) > 0
    for i, (a, b) in enumerate(zip(lo, so, strict=True)):
        assert a.get("error") is None and b.get("error") is None, (
            i,
            a.get("error"),
            b.get("error"),
        )
        assert (a["route"], a["answer"]) == (b["route"], b["answer"]), i
        da, db = a.get("draft") or {}, b.get("draft") or {}
        assert da.get("tokens") == db.get("tokens"), (i, da.get("tokens"), db.get("tokens"))
        if da.get("token_scores"):
            np.testing.assert_allclose(da["token_scores"], db["token_scores"], atol=1e-3)
            assert da["accepted"] == db["accepted"]
        assert [s.get("model_text") for s in a.get("agent_steps") or []] == [
            s.get("model_text") for s in b.get("agent_steps") or []
        ], i
        ta, tb = a.get("tool_draft") or {}, b.get("tool_draft") or {}  # depth-D speculation
        assert [s.get("model_text") for s in ta.get("steps") or []] == [
            s.get("model_text") for s in tb.get("steps") or []
        ], i
        assert (ta.get("tokens"), ta.get("accepted")) == (tb.get("tokens"), tb.get("accepted")), i
        if ta.get("token_scores"):
            np.testing.assert_allclose(ta["token_scores"], tb["token_scores"], atol=1e-3)
        calls = {"local": l_tokens[i], "served": s_tokens[i]}
        if da.get("discarded") or db.get("discarded"):
            # a draft made moot by the judge: cancelled while queued on one path, finished and
            # thrown away on the other (an HTTP request already sent): not part of the answer
            calls = {k: [c for c in v if c[0] != "speculator"] for k, v in calls.items()}
        assert calls["local"] == calls["served"], (i, calls)
        assert calls["local"] and min(n for _, n in calls["local"]) > 0  # every call reported


def local_run(models, configuration, queries):
    """The transformers path's run of a configuration, once per session."""
    if configuration not in _LOCAL_RUNS:
        _LOCAL_RUNS[configuration] = run_configuration(models, configuration, queries)
    return _LOCAL_RUNS[configuration]
