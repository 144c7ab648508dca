"""The report's plots: where people would rather look than read a table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..gate.calibration import raw_draft_score
from ..gate.separability import DEFAULT_ALPHA, separability_of
from .draft_scores import auroc, draft_score

__all__ = ["write_plots"]


def _gate_tau(report: dict[str, Any]) -> float:
    tau = report["summary"].get("tau")
    return float(tau) if isinstance(tau, (int, float)) and 0 < tau < 1 else 0.98


def write_plots(report: dict[str, Any], out: Path) -> list[str]:
    """The report's PNGs (accuracy vs modelled speedup, separability histogram, ROC against
    softmax confidence), those its data allows; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sw = report.get("sweep") or {}
    if sw.get("curves"):
        fig, ax = plt.subplots(figsize=(7, 5))
        styles = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v")]
        # without per-query latencies (imported runs) the x axis is the share accepted instead
        timed = all(c["speedup"] is not None for curve in sw["curves"].values() for c in curve)
        x_key = "speedup" if timed else "accepted"
        for i, (name, curve) in enumerate(sw["curves"].items()):
            ls, marker = styles[i % len(styles)]
            ax.plot(
                [c[x_key] for c in curve],
                [math.nan if c["accuracy"] is None else c["accuracy"] for c in curve],
                ls=ls,
                marker=marker,
                ms=5,
                mfc="none",
                lw=1.4,
                alpha=0.85,
                label=name,
            )
        ax.scatter(
            [1.0 if timed else 0.0], [sw["baseline_accuracy"]], color="black", marker="*", s=120,
            zorder=5, label="agent only",
        )  # fmt: skip
        if timed:
            ax.set_xlabel("modelled speedup over agent only (higher tau: left)")
            ax.set_title(f"Accuracy vs modelled speedup as tau varies ({sw['n']} queries)")
        else:
            ax.set_xlabel("share of queries answered by an accepted draft (higher tau: left)")
            ax.set_title(f"Accuracy vs drafts accepted as tau varies ({sw['n']} queries)")
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=8, title="score:aggregation", title_fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "accuracy_vs_speedup.png", dpi=110)
        plt.close(fig)
        written.append("accuracy_vs_speedup.png")
    # labelled drafts with a separability under min (token log-probs, or an imported score)
    scored = [
        (r, s)
        for r in report["_records"]
        if r.get("draft_correct") is not None and (s := raw_draft_score(r, "min")) is not None
    ]
    records = [r for r, _ in scored]
    if records:
        raw = [s for _, s in scored]
        right = [s for s, r in zip(raw, records, strict=True) if r["draft_correct"]]
        wrong = [s for s, r in zip(raw, records, strict=True) if not r["draft_correct"]]
        tau = _gate_tau(report)
        tau_raw = separability_of(tau)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        bins = np.linspace(min(min(raw), tau_raw) - 0.5, max(max(raw), tau_raw) + 0.5, 36)
        # matplotlib's stub types bins as Sequence[float]; hist takes any array of edges
        ax.hist(
            right,
            bins=bins,  # type: ignore[arg-type]
            alpha=0.6,
            label=f"right drafts ({len(right)})",
            color="tab:green",
        )
        ax.hist(
            wrong,
            bins=bins,  # type: ignore[arg-type]
            alpha=0.6,
            hatch="//",
            label=f"wrong drafts ({len(wrong)})",
            color="tab:red",
        )
        ax.axvline(
            tau_raw, color="black", ls="--",
            label=f"tau = {tau:g} on the gate score = separability {tau_raw:.2f}",
        )  # fmt: skip
        ax.set_xlabel("answer separability (min over the answer's tokens)")
        ax.set_ylabel("drafts")
        ax.set_title("Draft separability: accepted right of the dashed line")
        top = ax.secondary_xaxis(
            "top",
            functions=(
                lambda x: 1 / (1 + np.exp(-DEFAULT_ALPHA * np.asarray(x, float))),
                lambda p: (
                    np.log(np.clip(p, 1e-9, 1 - 1e-9) / (1 - np.clip(p, 1e-9, 1 - 1e-9)))
                    / DEFAULT_ALPHA
                ),
            ),
        )
        lo, hi = ax.get_xlim()
        ticks = [
            t
            for t in (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
            if lo < separability_of(t) < hi
        ]
        top.set_xticks(ticks, [f"{t:g}" for t in ticks])  # auto ticks crowd near 1
        top.set_xlabel(f"gate score = sigmoid({DEFAULT_ALPHA:g} x separability)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "separability_hist.png", dpi=110)
        plt.close(fig)
        written.append("separability_hist.png")
        labels = [bool(r["draft_correct"]) for r in records]
        if 0 < sum(labels) < len(labels):
            fig, ax = plt.subplots(figsize=(5, 5))
            # every record kept has token scores, so draft_score is never None for it
            softmax = [draft_score(r["draft"], "min", "softmax") for r in records]
            curves: list[tuple[str, list[float]]] = [("separability (min)", raw)]
            if all(s is not None for s in softmax):  # imported drafts have no softmax score
                curves.append(("softmax confidence", cast(list[float], softmax)))
            for (name, scores), ls in zip(curves, ("-", "--"), strict=False):
                fpr, tpr = _roc(scores, labels)
                ax.plot(fpr, tpr, ls=ls, label=f"{name}: AUROC {auroc(scores, labels):.3f}")
            ax.plot([0, 1], [0, 1], color="grey", ls=":", label="chance")
            ax.set_xlabel("false positive rate (wrong drafts accepted)")
            ax.set_ylabel("true positive rate (right drafts accepted)")
            ax.set_title(f"Which score tells right drafts from wrong ({len(labels)} drafts)")
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / "separability_vs_softmax_roc.png", dpi=110)
            plt.close(fig)
            written.append("separability_vs_softmax_roc.png")
    if report.get("online_gate"):
        from .online_report import plot_online

        name = plot_online(report["online_gate"], out)
        written += [name] if name else []
    return written


def _roc(scores: Sequence[float], labels: Sequence[bool]) -> tuple[list[float], list[float]]:
    pairs = sorted(zip(scores, labels, strict=True), key=lambda p: -p[0])
    pos = sum(labels)
    neg = len(labels) - pos
    tp = fp = 0
    fpr, tpr = [0.0], [0.0]
    for _, y in pairs:
        tp += y
        fp += not y
        fpr.append(fp / neg)
        tpr.append(tp / pos)
    return fpr, tpr
