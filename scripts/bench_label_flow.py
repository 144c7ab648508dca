"""When shadow runs stop labelling (docs/calibration.md, "When labels stop, the gate
tightens"): the graph with an online gate on scripted models, over seeds.

A gate learns to accept drafts at score 0.95 (60 queries the agent agrees with, shadows at
chance 0.5 labelling them); then every draft turns wrong (the agent contradicts it) and

- ``working``: the shadows still label: how many of the next 60 drafts are accepted;
- ``failing``: the shadow runs fail (the agent raises in the background): likewise;

and, on a second gate whose shadows fail for 40 queries while the traffic stays right and
then work again, how many queries it takes the probes to clear the trouble.

    python3 scripts/bench_label_flow.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from langchain_core.messages import AIMessage
from PIL import Image

from speceyes_graph import create_speceyes_graph
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from speceyes_graph.graph.fallback import AgentFallback
from speceyes_graph.models.scripted import ScriptedChatModel, fake_logprobs


class World:
    """The agent's answer now, and whether shadow runs fail."""

    answer = "A"
    broken = False


def build(seed: int) -> tuple[OnlineGate, object]:
    gate = OnlineGate(
        0.1, 0.5, tau=0.98, risk=RiskOptions(window=400, warmup=20),
        labels=LabelOptions(seed=seed), trust=TrustOptions(outage_tau=1.0),
    )  # fmt: skip
    draft = AIMessage(content="A", response_metadata={"logprobs": fake_logprobs(["A"], [5.0])})
    graph = create_speceyes_graph(
        judge=ScriptedChatModel(respond=lambda m: "no"),
        speculator=ScriptedChatModel(respond=lambda m: draft),
        agent=ScriptedChatModel(respond=lambda m: f"<answer>{World.answer}</answer>"),
        gate=gate,
    ).compile()
    return gate, graph


def run(gate: OnlineGate, graph, image: str, n: int) -> list[dict]:
    outs = []
    for i in range(n):
        outs.append(graph.invoke({"question": f"q{i} colour?", "images": [image]}))
        gate.shadows.drain(30)
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()

    shadow_answer = AgentFallback.shadow_answer

    def shadow(self, state, draft):  # type: ignore[no-untyped-def]
        if World.broken:
            raise RuntimeError("the agent fails in the background")
        return shadow_answer(self, state, draft)

    AgentFallback.shadow_answer = shadow  # type: ignore[method-assign]
    image = str(Path(tempfile.mkdtemp()) / "scene.png")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(image)

    accepted: dict[str, list[int]] = {"working": [], "failing": []}
    recovery: list[int] = []
    for seed in range(args.seeds):
        for case in accepted:
            World.answer, World.broken = "A", False
            gate, graph = build(seed)
            run(gate, graph, image, 60)
            World.answer, World.broken = "B", case == "failing"
            outs = run(gate, graph, image, 60)
            accepted[case].append(sum(o["route"] == "speculative" for o in outs))
        World.answer, World.broken = "A", False
        gate, graph = build(seed)
        run(gate, graph, image, 60)
        World.broken = True
        run(gate, graph, image, 40)
        World.broken = False
        waited = 0
        while gate.state()["trouble"] is not None and waited < 200:
            run(gate, graph, image, 1)
            waited += 1
        recovery.append(waited)

    print(f"{args.seeds} seeds; 60 wrong drafts after the gate learnt to accept their score:")
    for case, counts in accepted.items():
        print(
            f"  shadows {case:8s}: accepted median {statistics.median(counts):4.1f}, "
            f"max {max(counts):3d} (each: {counts})"
        )
    print(
        f"  shadows back after 40 failing queries: trouble cleared after median "
        f"{statistics.median(recovery):.0f}, max {max(recovery)} queries (each: {recovery})"
    )


if __name__ == "__main__":
    main()
