"""Reading an answer: the option letter or yes/no a reply gives, and whether two replies agree.

Option letters are read from the usual answer shapes ("A", "A.", "(A)", "A. red",
"<answer>A</answer>", "The answer is A", the option text alone), never by looking for a
letter *anywhere* in the reply (the published scripts' substring match counts "A" in "What
a red car" as option A). A marked letter ("A.", "(A)") followed by its own option's text is
that letter even when another option reads the same ("ELEVATE" and "ELEVATE."). Yes/no is
lower-cased and read from the first word or a lone yes/no. Anything unreadable counts as
wrong, and as disagreeing.

The benchmarks score with it (:mod:`speceyes_graph.benchmarks.scoring`), and the online
gate labels production's drafts with it (:func:`answers_agree`: a draft against the agent's
answer), so both read answers the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .prompts import option_letters
from .protocol import extract_answer

__all__ = ["answers_agree", "extract_choice", "extract_yes_no", "is_correct"]

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


def answers_agree(draft: str | None, answer: str | None, options: Sequence[str] | None) -> bool:
    """Whether a draft gives the same answer as another reply (the agent's): the same option
    letter, the same yes/no, or (free-form questions) the same words. An unreadable draft
    never agrees; an unreadable ``answer`` agrees only with the same words."""
    if options:
        chosen = extract_choice(draft, options)
        return chosen is not None and chosen == extract_choice(answer, options)
    said = extract_yes_no(draft)
    if said is not None:
        return said == extract_yes_no(answer)
    words = _words(_visible(draft))
    return bool(words) and words == _words(_visible(answer))
