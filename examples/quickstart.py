"""Quickstart: build the SpecEyes graph on the embedded demo models, run three queries,
print answer, route and draft score.

The demo checkpoints are tiny Qwen3-VL (small) and Qwen2.5-VL (large) models shipped with
the package, trained on the demo world (a coloured object in the region the question names;
tiny ones need the zoom tool). They learned their own prompts, hence ``DEMO_GRAPH_SETTINGS``.
Swap in real models without changing anything else: ``ChatTransformersVLM(
model="Qwen/Qwen3-VL-2B-Instruct", ...)`` or ``speceyes_graph.models.openai_models(...)`` for
vLLM servers, with the published prompts (the default).
"""

import tempfile
from pathlib import Path

from speceyes_graph import create_speceyes_graph
from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_models, demo_queries

models = demo_models()  # two ChatTransformersVLM over the shipped checkpoints
small, large = models["small"], models["large"]
graph = create_speceyes_graph(speculator=small, agent=large, **DEMO_GRAPH_SETTINGS).compile()

queries = demo_queries(Path(tempfile.mkdtemp()), 3, zoom_share=1 / 3, seed=1)
results = graph.batch(
    [{"question": q.question, "images": [q.image], "options": q.options} for q in queries]
)
for q, result in zip(queries, results, strict=True):
    draft = result.get("draft") or {}
    score = f"{draft['score']:.3f}" if draft.get("score") is not None else "-"
    print(
        f"{q.id} {q.split:<10} expected={q.meta['answer_text']:<7} answer={result['answer']!s:<7} "
        f"route={result['route']:<17} draft_score={score}"
    )
