"""Record the shipped demo checkpoints' routes and answers on a fixed query set.

tests/test_demo.py replays them: a silently broken checkpoint (or a change in how prompts
or images are rendered) shows up as a diff. Rerun after retraining:
python3 scripts/make_demo_golden.py
"""

import json
import tempfile
from pathlib import Path

from speceyes_graph.demo import demo_models, fixed_routes

N, SEED = 12, 7
results = fixed_routes(demo_models(batch_size=1), Path(tempfile.mkdtemp()), N, SEED)
out = Path(__file__).resolve().parents[1] / "tests" / "data" / "demo_golden.json"
out.write_text(json.dumps({"n": N, "seed": SEED, "results": results}, indent=1) + "\n")
for r in results:
    print(r["id"], "->", r["route"], r["answer"])
