"""A run's online-gate path, for ``speceyes report``: the tau each query met, the gate's own
estimate of its risk (with the upper bound it certified), the risk realised so far, and the
share of accepted drafts it shadow-verified.

Every draft an :class:`~speceyes_graph.gate.online.OnlineGate` gated records ``tau``,
``shadowed``, ``gated_at`` and the gate's ``gate_risk`` / ``gate_risk_bound`` at that moment,
so the path is read from the run's records alone (a resumed run included). The realised risk
counts the queries answered by an accepted draft that disagrees with the agent's answer to
the same query, where a baseline run (agent only) gives one, else with the reference answer;
the report says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..answers import answers_agree

__all__ = ["online_lines", "online_path", "plot_online"]

POINTS = 10  # rows of the printed path
STREAM_ROUTES = ("speculative", "rejected-agentic", "judged-agentic", "speculative-tools")


def online_path(
    records: Sequence[dict],
    max_risk: float | None = None,
    agent_answers: Mapping[str, str | None] | None = None,
) -> dict[str, Any] | None:
    """The path of a run gated online (None when no draft of it was)."""
    gated = [r for r in records if (r.get("draft") or {}).get("gated_at") is not None]
    if not gated:
        return None
    # in the order the queries finished (the records' order): close to the order they met
    # the gate, and queries without a draft (judged agentic) fall among them
    stream = [r for r in records if r.get("route") in STREAM_ROUTES]
    agent_answers = agent_answers or {}
    against = "agent" if any(r["id"] in agent_answers for r in gated) else "reference"
    steps, losses, accepted, shadowed = [], 0, 0, 0
    for i, r in enumerate(stream, start=1):
        draft = r.get("draft") or {}
        if draft.get("accepted") and r.get("route") == "speculative":
            accepted += 1
            shadowed += bool(draft.get("shadowed"))
            if r["id"] in agent_answers:
                losses += not answers_agree(
                    draft.get("text"), agent_answers[r["id"]], r.get("options")
                )
            else:
                losses += not r.get("draft_correct")
        steps.append(
            {
                "query": i,
                "tau": draft.get("tau"),
                "gate_risk": draft.get("gate_risk"),
                "gate_risk_bound": draft.get("gate_risk_bound"),
                "realised_risk": losses / i,
                "accepted": accepted,
                "shadowed": shadowed,
            }
        )
    taus = [s["tau"] for s in steps if s["tau"] is not None]
    last = next((s for s in reversed(steps) if s["gate_risk"] is not None), None)
    n = len(stream)
    return {
        "queries": n,
        "gated": len(gated),
        "max_risk": max_risk,
        "against": against,
        "acceptance": accepted / n if n else 0.0,
        "accepted": accepted,
        "shadowed": shadowed,
        "shadow_share": shadowed / accepted if accepted else None,
        "realised_risk": losses / n if n else 0.0,
        "accepted_error": losses / accepted if accepted else None,
        "tau_start": taus[0] if taus else None,
        "tau_min": min(taus) if taus else None,
        "tau_max": max(taus) if taus else None,
        "tau_end": taus[-1] if taus else None,
        "gate_risk_end": last["gate_risk"] if last else None,
        "gate_risk_bound_end": last["gate_risk_bound"] if last else None,
        "path": steps,
    }


def _f(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def online_lines(path: dict[str, Any]) -> list[str]:
    """The report's section: what the gate did, then its path at ``POINTS`` points."""
    source = "agent only's answer" if path["against"] == "agent" else "the reference answer"
    lines = [
        "",
        "## Online gate",
        "",
        f"{path['gated']} drafts gated online over {path['queries']} queries"
        + (f", target risk {path['max_risk']:g}" if path["max_risk"] is not None else "")
        + f". Accepted {path['accepted']} ({_f(path['acceptance'], '.3f')}), of which "
        f"{path['shadowed']} shadow-verified ({_f(path['shadow_share'], '.3f')}). Realised "
        f"risk {_f(path['realised_risk'])} (queries answered by an accepted draft that "
        f"disagrees with {source}; accepted drafts' error {_f(path['accepted_error'], '.3f')}). "
        f"tau {_f(path['tau_start'])} at the start, {_f(path['tau_end'])} at the end "
        f"(min {_f(path['tau_min'])}, max {_f(path['tau_max'])}); the gate's last estimate of "
        f"its window's risk {_f(path['gate_risk_end'])}, certified at most "
        f"{_f(path['gate_risk_bound_end'])}.",
        "",
        "| queries | tau met | gate's risk estimate | its upper bound | realised risk | "
        "accepted | shadowed |",
        "|---|---|---|---|---|---|---|",
    ]
    steps = path["path"]
    every = max(1, len(steps) // POINTS)
    for s in steps[every - 1 :: every]:
        lines.append(
            f"| {s['query']} | {_f(s['tau'])} | {_f(s['gate_risk'])} | "
            f"{_f(s['gate_risk_bound'])} | {_f(s['realised_risk'])} | {s['accepted']} | "
            f"{s['shadowed']} |"
        )
    return lines


def plot_online(path: dict[str, Any], out: Path) -> str | None:
    """``online_gate.png``: tau over the stream above, the gate's risk estimate with its
    bound and the realised risk below, beside the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = path["path"]
    if not steps:
        return None
    x = [s["query"] for s in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    drafted = [s for s in steps if s["tau"] is not None]  # queries judged agentic met no tau
    top.step([s["query"] for s in drafted], [s["tau"] for s in drafted], where="post",
             label="tau met")  # fmt: skip
    top.set_ylabel("tau")
    top.legend(loc="lower right")
    est = [s["gate_risk"] for s in steps]
    bound = [s["gate_risk_bound"] for s in steps]
    known = [i for i, e in enumerate(est) if e is not None]
    if known:
        xs = [x[i] for i in known]
        bottom.plot(xs, [est[i] for i in known], label="gate's estimate (window)")
        bottom.fill_between(
            xs, [est[i] for i in known], [bound[i] for i in known], alpha=0.25,
            label="up to its upper bound",
        )  # fmt: skip
    bottom.plot(x, [s["realised_risk"] for s in steps], label="realised risk (running)")
    if path.get("max_risk") is not None:
        bottom.axhline(path["max_risk"], color="k", linestyle="--", label="target")
    bottom.set_xlabel("query")
    bottom.set_ylabel("risk")
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle("The online gate over the run")
    fig.tight_layout()
    fig.savefig(out / "online_gate.png", dpi=110)
    plt.close(fig)
    return "online_gate.png"
