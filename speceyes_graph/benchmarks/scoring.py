"""Scoring that does not flatter.

Option letters are read from the usual answer shapes ("A", "A.", "(A)", "A. red",
"<answer>A</answer>", "The answer is A", the option text alone), never by looking for a
letter *anywhere* in the reply (the published scripts' substring match counts "A" in "What
a red car" as option A). A marked letter ("A.", "(A)") followed by its own option's text is
that letter even when another option reads the same ("ELEVATE" and "ELEVATE."). Yes/no is lower-cased and read from the first word or a lone
yes/no. Anything unreadable, and every errored query, counts as wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..prompts import option_letters
from ..protocol import extract_answer

__all__ = [
    "PopeMetrics",
    "extract_choice",
    "extract_yes_no",
    "is_correct",
    "llm_judge",
    "pope_metrics",
]

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
_LEAD = re.compile(r"^\s*[\(\[]?\s*([A-Z])\s*[\)\]]?(?:[.:,)\s]|$)")
_STATED = re.compile(
    r"(?:answer|option|choice)\s*(?:is|:)?\s*[:\-]?\s*[\(\[]?([A-Z])[\)\]]?(?:[.,:\s]|$)", re.I
)


def _visible(text: str | None) -> str:
    text = text or ""
    inner = extract_answer(text)
    if inner is not None:
        return inner
    return _THINK.sub("", text).strip()


def _words(s: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).split()


def _mentioned(words: list[str], options: Sequence[str]) -> list[str]:
    """Letters of the options whose text appears in ``words`` as whole words; an option that
    only appears inside a longer mentioned one ("red" in "dark red") does not count."""
    letters = option_letters(len(options))
    hits = [
        (i, _words(o)) for i, o in enumerate(options) if _words(o) and _contains(words, _words(o))
    ]
    return [
        letters[i]
        for i, phrase in hits
        if not any(
            len(other) > len(phrase) and _contains(other, phrase) for j, other in hits if j != i
        )
    ]


def extract_choice(reply: str | None, options: Sequence[str]) -> str | None:
    """The option letter a reply chose, or None if it cannot be read unambiguously."""
    letters = option_letters(len(options))
    text = _visible(reply)
    if not text:
        return None
    m = _LEAD.match(text)
    if m and m.group(1) in letters:
        letter, rest = m.group(1), text[m.end() :].strip()
        marked = bool(re.match(r"^\s*[\(\[]", text)) or text[m.end() - 1 : m.end()] in ".:,)]"
        in_rest = _mentioned(_words(rest), options)
        if not in_rest or in_rest == [letter]:
            return letter
        if marked and letter in in_rest:
            # "A. ELEVATE" with options "ELEVATE" and "ELEVATE.": near-duplicate options read
            # alike, and the explicit letter says which one was meant
            return letter
        if len(in_rest) == 1:
            # "A blue car": an article, not a letter; "A. blue" with A = red: a contradiction
            return None if marked else in_rest[0]
    m = _STATED.search(text)
    if m and m.group(1) in letters:
        return m.group(1)
    words = _words(text)
    exact = [letters[i] for i, o in enumerate(options) if _words(o) == words]
    if len(exact) == 1:
        return exact[0]
    mentioned = _mentioned(words, options)
    return mentioned[0] if len(mentioned) == 1 else None


def _contains(words: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return any(words[i : i + n] == phrase for i in range(len(words) - n + 1))


def extract_yes_no(reply: str | None) -> str | None:
    """ "yes"/"no" from a reply (lower-cased), or None."""
    words = _words(_visible(reply))
    if not words:
        return None
    if words[0] in ("yes", "no"):
        return words[0]
    found = {w for w in words if w in ("yes", "no")}
    return found.pop() if len(found) == 1 else None


def is_correct(reply: str | None, expected: str, options: Sequence[str] | None) -> bool:
    if options:
        return extract_choice(reply, options) == expected
    return extract_yes_no(reply) == expected.lower()


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
