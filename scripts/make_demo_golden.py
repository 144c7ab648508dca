"""Record the shipped demo checkpoints' routes and answers on a fixed query set.

tests/test_demo.py replays them: a silently broken checkpoint (or a change in how prompts
or images are rendered) shows up as a diff. Rerun after retraining:
python3 scripts/make_demo_golden.py
"""

import json
import tempfile
from pathlib import Path

from speceyes_graph import GateConfig, create_speceyes_graph
from speceyes_graph.demo import demo_checkpoints, demo_queries
from speceyes_graph.models import ChatTransformersVLM
from speceyes_graph.training import DEMO_PROMPTS

N, SEED = 12, 7
paths = demo_checkpoints()
small = ChatTransformersVLM(
    model=str(paths["small"]), top_logprobs=64, max_new_tokens=8, max_batch_size=1
)
large = ChatTransformersVLM(model=str(paths["large"]), max_new_tokens=96, max_batch_size=1)
graph = create_speceyes_graph(
    speculator=small, agent=large, prompts=DEMO_PROMPTS, gate=GateConfig(), max_agent_steps=4
).compile()
queries = demo_queries(Path(tempfile.mkdtemp()), N, seed=SEED)
outs = graph.batch(
    [{"question": q.question, "images": [q.image], "options": q.options} for q in queries],
    {"max_concurrency": 16},
)
results = [
    {"id": q.id, "route": o["route"], "answer": o["answer"]}
    for q, o in zip(queries, outs, strict=True)
]
out = Path(__file__).resolve().parents[1] / "tests" / "data" / "demo_golden.json"
out.write_text(json.dumps({"n": N, "seed": SEED, "results": results}, indent=1) + "\n")
for q, r in zip(queries, results, strict=True):
    print(r["id"], q.split, q.meta["answer_text"], "->", r["route"], r["answer"])
