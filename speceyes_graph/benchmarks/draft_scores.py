"""Recorded drafts scored again offline: per-token separability, re-aggregation, AUROC.

Both the report's tables and its plots read drafts through these, so a what-if (another
aggregation, the softmax baseline) is computed one way everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..gate.separability import (
    DEFAULT_ALPHA,
    Aggregation,
    acceptance_score,
    aggregate,
    sorted_separability,
)

__all__ = ["auroc", "draft_score", "draft_token_scores"]


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (probability a right draft outscores a wrong one; ties half)."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    values = np.concatenate([pos, neg])[order]
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def draft_token_scores(draft: dict) -> np.ndarray | None:
    """Per-token separability recomputed from a recorded draft's sorted top-K log-probs."""
    top = draft.get("top_logprobs") if draft else None
    if not top:
        return None
    return sorted_separability(np.asarray(top, dtype=float))


def draft_score(draft: dict, aggregation: Aggregation, score: str = "separability") -> float | None:
    """A recorded draft re-gated offline: its acceptance score under another aggregation or
    score (the sweep's what-ifs), None when it kept no log-probs (a score-only draft: its
    recorded score, under the aggregation it was scored with only)."""
    ts = draft_token_scores(draft)
    if ts is None or len(ts) == 0:
        if draft and draft.get("score_only"):  # imported: the one score its source computed
            if score == "softmax":
                return draft.get("softmax_confidence")
            return draft.get("score") if draft.get("aggregation") == aggregation else None
        return None
    if score == "softmax":
        return float(np.exp(np.mean(np.asarray(draft["top_logprobs"], dtype=float)[:, 0])))
    return acceptance_score(aggregate(ts, aggregation), DEFAULT_ALPHA)
