"""Calibrate the demo's tau_depth (depth-1 speculation) on scenes the evaluation never sees.

Runs agent only and SpecEyes depth 1 on 300 calibration scenes (seed 777_001; ``speceyes
demo`` evaluates on seed 20_251_130), then ``calibrate`` (Learn-then-Test, accuracy lost to
accepted answers at most 1% with probability >= 0.9). The demo's gate
(``DEMO_GRAPH_SETTINGS["gate"]``) carries the result, rounded up (stricter):

    .venv/bin/python scripts/calibrate_demo_depth.py [OUT_DIR]
"""

import json
import sys
from pathlib import Path

from speceyes_graph.benchmarks.runner import read_records, run_benchmark
from speceyes_graph.demo import demo_graph, demo_models, demo_queries
from speceyes_graph.gate.calibration import calibrate

out = Path(sys.argv[1] if len(sys.argv) > 1 else "speceyes-demo-calibration")
models = demo_models(batch_size=16)
queries = demo_queries(out / "scenes", 300, seed=777_001)
graphs = {
    "agent": demo_graph(large=models["large"], mode="agent"),
    "speceyes": demo_graph(models["small"], models["large"], speculation_depth=1),
}
for mode, graph in graphs.items():
    run_benchmark(graph.compile(), queries, out / f"run-{mode}", mode=mode, concurrency=64)
result = calibrate(
    read_records(out / "run-speceyes"),
    max_drop=0.01,
    delta=0.1,
    baseline=read_records(out / "run-agent"),
)
result.save(out / "gate.json")
print(json.dumps({"tau_depth": result.tau_depth, "on calibration": result.depth_calibration}))
