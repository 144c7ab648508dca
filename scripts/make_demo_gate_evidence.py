"""The demo online gate's warm start: labelled calibration queries for the shipped checkpoints.

Runs agent only and SpecEyes (depth 0, the published gate) on 300 calibration scenes the
demo never evaluates on (seed 777_002; ``speceyes demo`` evaluates on seed 20_251_130), then
``calibrate`` against agent only (a loss: accepted, draft wrong, agent right), and keeps the
gate file's ``evidence`` (each query's separability, or None where the judge sent it to the
tools, and its loss) in ``speceyes_graph/demo/gate_evidence.json``, which
``demo_online_gate`` starts from:

    .venv/bin/python scripts/make_demo_gate_evidence.py [OUT_DIR]
"""

import json
import sys
from pathlib import Path

from speceyes_graph.benchmarks.runner import read_records, run_benchmark
from speceyes_graph.demo import demo_graph, demo_models, demo_queries
from speceyes_graph.gate.calibration import calibrate

out = Path(sys.argv[1] if len(sys.argv) > 1 else "speceyes-demo-evidence")
models = demo_models(batch_size=16)
queries = demo_queries(out / "scenes", 300, seed=777_002)
graphs = {
    "agent": demo_graph(large=models["large"], mode="agent"),
    "speceyes": demo_graph(models["small"], models["large"]),
}
for mode, graph in graphs.items():
    run_benchmark(graph.compile(), queries, out / f"run-{mode}", mode=mode, concurrency=64)
result = calibrate(
    read_records(out / "run-speceyes"),
    max_drop=0.05,
    delta=0.1,
    baseline=read_records(out / "run-agent"),
)
target = Path(__file__).parents[1] / "speceyes_graph" / "demo" / "gate_evidence.json"
kept = {"scale": "separability, min over the answer's tokens, K 64", "seed": 777_002,
        "loss": result.loss, "evidence_scale": result.evidence_scale,
        "evidence": result.evidence}  # fmt: skip
target.write_text(json.dumps({"gate": kept}) + "\n")
losses = sum(loss for _, loss in result.evidence)
print(f"wrote {target}: {len(result.evidence)} queries, {losses} losses")
