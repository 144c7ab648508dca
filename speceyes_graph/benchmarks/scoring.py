"""Scoring that does not flatter: answers are read as :mod:`speceyes_graph.answers` reads
them (never a letter found *anywhere* in the reply, as the published scripts' substring
match does); anything unreadable, and every errored query, counts as wrong. POPE's metrics
and a free-form LLM judge beside them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..answers import extract_choice, extract_yes_no, is_correct

__all__ = [
    "PopeMetrics",
    "extract_choice",
    "extract_yes_no",
    "is_correct",
    "llm_judge",
    "pope_metrics",
]


@dataclass
class PopeMetrics:
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    yes_ratio: float
    unreadable: int


def pope_metrics(pairs: Iterable[tuple[str | None, str]]) -> PopeMetrics:
    """POPE's metrics from (predicted yes/no or None, expected yes/no).

    An unreadable prediction (None) is wrong for accuracy and a miss for recall, but it is
    not a "yes", so it is not a false positive and does not count in the yes-ratio.
    """
    tp = fp = tn = fn = unreadable = n = 0
    for pred, gold in pairs:
        n += 1
        if pred is None:
            unreadable += 1
            fn += gold == "yes"
        elif pred == "yes":
            tp += gold == "yes"
            fp += gold == "no"
        else:
            tn += gold == "no"
            fn += gold == "yes"
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = (tp + tn) / n if n else 0.0
    return PopeMetrics(n, accuracy, precision, recall, f1, (tp + fp) / n if n else 0.0, unreadable)


JUDGE_PROMPT = (
    "You grade answers. Question: {question}\nReference answer: {reference}\nModel answer: {answer}\n"
    "Does the model answer mean the same as the reference? Reply with only yes or no."
)


def llm_judge(chat_model, question: str, reference: str, answer: str | None) -> bool:
    """Free-form grading with any LangChain chat model (``yes`` means correct)."""
    if not answer:
        return False
    reply = chat_model.invoke(
        JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
    )
    return extract_yes_no(getattr(reply, "content", str(reply))) == "yes"
