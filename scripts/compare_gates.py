"""Three ways to choose tau, checked against labels: published, labelled, label-free.

For each setting (the demo world, the synthetic suite, tiny random checkpoints) this runs a
*calibration* set and an *evaluation* set of queries (different seeds) in three modes:
agent only (the labels' baseline), SpecEyes (drafts on the judge's tool-free queries) and
small only (a draft on every query). Runs resume: a rerun only does what is missing. Then,
for each population of drafts (SpecEyes, small only), it chooses tau on the calibration set

- published: 0.98;
- labelled: ``calibrate`` (Learn-then-Test, at most 1% accuracy lost, probability 0.9);
- label-free: ``calibrate_unlabelled`` (two-component fit; "refused" when not bimodal);

and prints what each does on the evaluation set: acceptance, accuracy of the accepted
drafts, end-to-end accuracy against agent only, modelled speedup.

    .venv/bin/python scripts/compare_gates.py [OUT_DIR] [--settings demo,synthetic,tiny]

The tiny checkpoints are random (``speceyes make-tiny-models``) and slow to decode their
long babble on a CPU, hence fewer queries (``--n-tiny``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from speceyes_graph.benchmarks.runner import read_records
from speceyes_graph.benchmarks.sweep import compare_gates, gates_table
from speceyes_graph.cli import main as speceyes
from speceyes_graph.gate.calibration import calibrate
from speceyes_graph.gate.label_free import NotBimodal, calibrate_unlabelled
from speceyes_graph.gate.separability import DEFAULT_TAU

MODES = ("agent", "speceyes", "small")
SEEDS = {"cal": 777_001, "eval": 20_251_130}


def run_demo(out: Path, n: int) -> None:
    from speceyes_graph.benchmarks.runner import run_benchmark
    from speceyes_graph.demo import demo_graph, demo_models, demo_queries

    models = demo_models(batch_size=16)
    graphs = {
        "agent": demo_graph(large=models["large"], mode="agent"),
        "speceyes": demo_graph(models["small"], models["large"]),
        "small": demo_graph(small=models["small"], mode="small"),
    }
    for split, seed in SEEDS.items():
        queries = demo_queries(out / f"scenes-{split}", n, seed=seed)
        for mode in MODES:
            run_benchmark(
                graphs[mode].compile(), queries, out / f"{split}-{mode}", mode=mode,
                concurrency=64, desc=f"demo {split} {mode}",
            )  # fmt: skip


def run_bench(out: Path, n: int, models: str) -> None:
    """The synthetic suite through ``speceyes bench``, exactly as a user runs it."""
    if models.startswith("tiny:") and not Path(models[5:], "config.json").exists():
        speceyes(["make-tiny-models", models[5:]])
    for split, seed in SEEDS.items():
        data = out / f"data-{split}"
        if not (data / "suite.json").exists():
            speceyes(["synth", str(data), "--n", str(n), "--seed", str(seed)])
        for mode in MODES:
            args = ["bench", "--benchmark", "synthetic", "--data", str(data), "--mode", mode]
            if mode != "agent":
                args += ["--small", models]
            if mode != "small":
                args += ["--large", models]
            speceyes([*args, "--out", str(out / f"{split}-{mode}")])


def compare(out: Path, population: str) -> str:
    cal, cal_agent = read_records(out / f"cal-{population}"), read_records(out / "cal-agent")
    labelled = calibrate(cal, max_drop=0.01, delta=0.1, baseline=cal_agent)
    try:
        free = calibrate_unlabelled(cal)
        free_tau, why = free.tau, ""
    except NotBimodal as exc:
        free_tau, why = None, f"\nlabel-free refused: {exc}\n"
    rows = compare_gates(
        read_records(out / f"eval-{population}"),
        read_records(out / "eval-agent"),
        {"published": DEFAULT_TAU, "labelled (LTT, 1%, 0.9)": labelled.tau, "label-free": free_tau},
    )
    return gates_table(rows) + why


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="speceyes-gates")
    parser.add_argument("--settings", default="demo,synthetic,tiny")
    parser.add_argument("--n", type=int, default=300, help="queries per set (demo)")
    parser.add_argument("--n-bench", type=int, default=100, help="queries per set (suite)")
    parser.add_argument("--n-tiny", type=int, default=40, help="queries per set (tiny models)")
    args = parser.parse_args()
    root = Path(args.out)
    runners = {
        "demo": lambda p: run_demo(p, args.n),
        "synthetic": lambda p: run_bench(p, args.n_bench, "demo"),
        "tiny": lambda p: run_bench(p, args.n_tiny, f"tiny:{root / 'tiny-models'}"),
    }
    tables = []
    for setting in args.settings.split(","):
        runners[setting](root / setting)
        for population in ("speceyes", "small"):
            title = f"## {setting}: drafts of --mode {population}, evaluated on other queries"
            tables.append(f"{title}\n\n{compare(root / setting, population)}")
    text = "\n".join(tables)
    (root / "gates.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
