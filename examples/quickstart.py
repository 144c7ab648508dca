"""Quickstart: build the SpecEyes graph, run three queries, print answer, route and score.

Runs offline on the built-in example's scripted models (the graph, gate, zoom tool and
coordinate mapping are real). Swap in real chat models without changing anything else:
``ChatOpenAI`` clients of vLLM servers (``speceyes_graph.serving.openai_models``) or local
checkpoints (``speceyes_graph.models.ChatTransformersVLM``).
"""

import tempfile
from pathlib import Path

from speceyes_graph import create_speceyes_graph
from speceyes_graph.example import make_example_models, make_example_scenes

queries = make_example_scenes(Path(tempfile.mkdtemp()))[1:4]
judge, speculator, agent = make_example_models()
graph = create_speceyes_graph(judge=judge, speculator=speculator, agent=agent).compile()

inputs = [{k: q[k] for k in ("question", "images", "options")} for q in queries]
for q, result in zip(queries, graph.batch(inputs), strict=True):
    draft = result.get("draft") or {}
    score = f"{draft['score']:.3f}" if draft.get("score") is not None else "-"
    print(
        f"{q['query_id']:<12} route={result['route']:<17} answer={result['answer']} draft_score={score}"
    )
