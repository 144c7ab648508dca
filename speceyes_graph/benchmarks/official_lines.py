"""One result line of the published SpecEyes scripts, read as a runner record.

The authors' evaluation (``eval_code_deepeyes/SpecEyes.py``, ``eval_code_thyme/SpecEyes.py``,
with or without ``--baseline``) writes one JSON line per query, in a file named
``{benchmark}_{split}_{large}_{small}_{batch}_{mode}_{threshold}.jsonl``
(``..._baseline_{batch}_None_None.jsonl`` for the large model alone). A line holds ``status``,
``judge_tc`` (the judge's "yes": tools needed), ``use_model`` (``small``: the draft was
accepted), ``confidence_score`` (``sigmoid(0.6 x S)`` of the ``mode`` aggregation, -1 when
no draft was made), ``small_answer``, ``generated_length`` and ``result`` (question, reference
answer, ``pred_ans``); DeepEyes lines add ``error`` and ``print_messages``, Thyme lines
``messages``.

What the lines do not hold, and how a record copes:

- **No top-K log-probs.** A draft is known by its score alone: a *score-only* draft records
  its score, the aggregation, alpha and K the script used, and the separability the score
  implies (``logit(score) / alpha``). Tools that would re-aggregate (another aggregation, the
  softmax baseline) find no score for it rather than a made-up one.
- **Rejected drafts' text.** DeepEyes keeps it in ``print_messages`` (the assistant turn after
  the prompt); Thyme drops it, so those drafts' correctness is unknown (``draft_correct``
  None) and the labelled tools leave them out of what they claim.
- **Options.** V* lines carry only the right option's text; HR-Bench DeepEyes lines only the
  letter. The options are read from the prompt the line kept, else from the dataset, else
  (V*) the line is scored against the right option alone, and said so.

Correctness is our scorer's (:func:`.scoring.is_correct` on ``pred_ans``); the published rule's
verdict (:func:`.official.official_rule`, None where the scripts would ask their LLM grader)
is kept beside it as ``official_correct``. A line that cannot be a record raises
:class:`BadLine` with the reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..gate.separability import DEFAULT_ALPHA, DEFAULT_K, separability_of
from ..prompts import option_letters
from .official import official_rule
from .scoring import is_correct

__all__ = [
    "AGGREGATION_NAMES",
    "BENCHMARK_NAMES",
    "BadLine",
    "OfficialRun",
    "official_record",
    "parse_result_name",
]

# the scripts' --benchmark values -> this package's benchmark names
BENCHMARK_NAMES = {"vstar": "vstar", "hr": "hrbench", "pope": "pope"}
# the scripts' --mode values -> this package's aggregations ("log": the softmax baseline)
AGGREGATION_NAMES = {"min": "min", "mean": "mean", "bottom20": "bottom-q", "log": "softmax"}
SPLITS = {
    "vstar": ("direct_attributes", "relative_position"),
    "hr": ("hr_bench_4k", "hr_bench_8k"),
    "pope": ("adversarial", "popular", "random"),
}
_NAME_TAIL = re.compile(
    r"_(?P<batch>\d+)_(?P<mode>min|mean|bottom20|log|None)_(?P<tau>[0-9.]+|None)"
    r"(?:_K=(?P<k>\d+))?(?P<phase1>_PhaseIMs)?$"
)
_OPTION_LINE = re.compile(r"^\s*([A-Z])\.\s?(.*?)\s*$")


class BadLine(ValueError):
    """A result line that cannot become a record (the message says why)."""


@dataclass(frozen=True)
class OfficialRun:
    """What a result file's name and the caller say about the run that wrote it."""

    benchmark: str  # the scripts' name: vstar, hr, pope
    split: str
    mode: str  # "speceyes" or "agent" (--baseline: the large model alone)
    aggregation: str | None  # the scripts' --mode (min, mean, bottom20, log); None: baseline
    tau: float | None
    k: int = DEFAULT_K
    large_model: str | None = None
    small_model: str | None = None
    batch_size: int | None = None
    phase1_small: bool = False  # --ablation_phaseI_Ms: the small model judged


def parse_result_name(path: str | Path) -> dict[str, Any]:
    """The run's settings from a result file's name, as far as the name tells them."""
    stem = Path(path).name.removesuffix(".jsonl")
    out: dict[str, Any] = {}
    bench, _, rest = stem.partition("_")
    if bench not in SPLITS:
        return out
    out["benchmark"] = bench
    split = next((s for s in SPLITS[bench] if rest.startswith(s + "_") or rest == s), None)
    if split is None:
        return out
    out["split"] = split
    rest = rest[len(split) + 1 :]
    tail = _NAME_TAIL.search(rest)
    if tail is None:
        return out
    models = rest[: tail.start()]
    baseline = models.endswith("_baseline") and tail["mode"] == "None"
    large, _, small = (
        models.rpartition("_") if not baseline else (models[: -len("_baseline")], "", "")
    )
    out.update(
        mode="agent" if baseline else "speceyes",
        aggregation=None if tail["mode"] == "None" else tail["mode"],
        tau=None if tail["tau"] == "None" else float(tail["tau"].rstrip(".")),
        k=int(tail["k"]) if tail["k"] else DEFAULT_K,
        large_model=large or None,
        small_model=small or None,
        batch_size=int(tail["batch"]),
        phase1_small=bool(tail["phase1"]),
    )
    return out


def _texts(messages: Any) -> Iterable[str]:
    """Every text in a kept conversation (strings, or OpenAI-style content parts)."""
    if isinstance(messages, str):
        yield messages
    elif isinstance(messages, Mapping):
        if messages.get("type") in (None, "text") and isinstance(messages.get("text"), str):
            yield messages["text"]
        content = messages.get("content")
        if content is not None:
            yield from _texts(content)
    elif isinstance(messages, list):
        for m in messages:
            yield from _texts(m)


def _options_from_prompt(line: Mapping[str, Any]) -> list[str] | None:
    """The options as the prompt showed them ("Options:" then "A. ...", "B. ..." lines)."""
    for text in _texts([line.get("print_messages"), line.get("messages")]):
        _, found, after = text.partition("Options:")
        if not found:
            continue
        options: list[str] = []
        for row in after.splitlines():
            m = _OPTION_LINE.match(row)
            if m and m.group(1) == chr(ord("A") + len(options)):
                options.append(m.group(2))
            elif options and row.strip():
                break
        if len(options) >= 2:
            return options
    return None


def _unlettered(options: Sequence[Any]) -> list[str]:
    """HR-Bench result options come as "A. text": the text."""
    out = []
    for i, o in enumerate(options):
        m = _OPTION_LINE.match(str(o))
        out.append(m.group(2) if m and m.group(1) == chr(ord("A") + i) else str(o))
    return out


def _draft_text(line: Mapping[str, Any]) -> str | None:
    """The small model's reply: kept in ``small_answer`` when accepted; for a rejected draft,
    DeepEyes keeps it as the first assistant turn of ``print_messages`` (Thyme drops it)."""
    if line.get("use_model") == "small":
        text = line.get("small_answer")
        return text if isinstance(text, str) else None
    kept = line.get("print_messages")
    if isinstance(kept, list) and len(kept) > 2 and isinstance(kept[2], Mapping):
        turn = kept[2]
        if turn.get("role") == "assistant" and isinstance(turn.get("content"), str):
            return turn["content"]
    return None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadLine(f"{what} is not a number: {value!r}")
    return float(value)


def official_record(
    line: Any,
    run: OfficialRun,
    *,
    options_lookup: Mapping[tuple[str, str], list[str]] | None = None,
) -> dict[str, Any]:
    """One result line as a runner record (see the module docstring); raises :class:`BadLine`."""
    if not isinstance(line, Mapping):
        raise BadLine("not a JSON object")
    missing = [
        k
        for k in ("status", "judge_tc", "use_model", "confidence_score", "result")
        if k not in line
    ]
    result = line.get("result")
    if not missing and not isinstance(result, Mapping):
        raise BadLine("result is not an object")
    missing += [
        k
        for k in ("question", "answer", "pred_ans")
        if isinstance(result, Mapping) and k not in result
    ]
    if missing:
        raise BadLine(f"missing field{'s' * (len(missing) > 1)} {', '.join(missing)}")
    assert isinstance(result, Mapping)
    if line["status"] != "success":
        reason = line.get("error") or "no reason given"
        raise BadLine(f"status {line['status']!r} ({str(reason)[:200]})")
    key = _query_key(run, result)
    qid = f"{run.split}/{key}"
    question = str(result["question"])
    options: list[str] | None = None
    expected = str(result["answer"]).strip()
    options_note = None
    if run.benchmark == "pope":
        expected = expected.lower()
        if expected not in ("yes", "no"):
            raise BadLine(f"POPE answer is not yes/no: {result['answer']!r}")
    else:
        if isinstance(result.get("options"), list) and len(result["options"]) >= 2:
            options = _unlettered(result["options"])
        options = options or _options_from_prompt(line)
        if options is None and options_lookup is not None:
            options = options_lookup.get((run.split, key))
        if run.benchmark == "vstar":  # the answer is the right option's text
            if options is None:
                options, options_note = [expected], "scored against the right option alone"
            if expected not in options:
                raise BadLine(f"the answer {expected!r} is not among the options {options!r}")
            expected = option_letters(len(options))[options.index(expected)]
        else:
            expected = expected.upper()
            if not re.fullmatch(r"[A-Z]", expected):
                raise BadLine(f"HR-Bench answer is not a letter: {result['answer']!r}")
            if options is None:
                raise BadLine(
                    "no options in the line or the dataset (pass the HR-Bench file as data)"
                )
    judge_tc = str(line["judge_tc"]).strip().lower()
    accepted = line["use_model"] == "small"
    if line["use_model"] not in ("small", "large"):
        raise BadLine(f"use_model is {line['use_model']!r}, not small or large")
    score = _number(line["confidence_score"], "confidence_score")
    drafted = judge_tc.startswith("no")
    if run.mode == "agent" and (drafted or accepted):
        raise BadLine("a baseline run's line has a draft")
    draft = None
    if drafted:
        if not 0 < score < 1:
            raise BadLine(f"confidence_score {score!r} is outside (0, 1)")
        if run.tau is not None and accepted != (score > run.tau):
            raise BadLine(
                f"{'accepted' if accepted else 'rejected'} with confidence_score {score} at "
                f"threshold {run.tau} (is the threshold right?)"
            )
        draft = _score_only_draft(line, run, score, accepted)
    elif accepted:
        raise BadLine("the small model answered a query the judge sent to the tools")
    answer = str(result["pred_ans"])
    if run.mode == "agent":
        route = "agent-only"
    elif not drafted:
        route = "judged-agentic"
    else:
        route = "speculative" if accepted else "rejected-agentic"
    draft_text = draft.get("text") if draft else None
    official_bench = "hrbench" if run.benchmark == "hr" else run.benchmark
    meta: dict[str, Any] = {
        "official": {k: result[k] for k in result if k not in ("question", "pred_ans")}
        | {"judge_tc": line["judge_tc"], "use_model": line["use_model"]},
        "generated_length": line.get("generated_length"),
    }
    if options_note:
        meta["options_note"] = options_note
    return {
        "id": qid,
        "split": run.split,
        "question": question,
        "options": options,
        "expected": expected,
        "mode": run.mode,
        "answer": answer,
        "correct": is_correct(answer, expected, options),
        "official_correct": official_rule(official_bench, answer, expected, options),
        "route": route,
        "judge_output": line["judge_tc"] if run.mode == "speceyes" else None,
        "draft": draft,
        "draft_correct": (
            None
            if draft is None or draft_text is None
            else is_correct(draft_text, expected, options)
        ),
        "tool_draft": None,
        "tool_draft_correct": False,
        "agent_steps": [],
        "stop_reason": None,
        "timings": {},
        "latency_s": None,
        "error": None,
        "meta": meta,
    }


def _query_key(run: OfficialRun, result: Mapping[str, Any]) -> str:
    if run.benchmark == "vstar":
        image = result.get("image")
        if not isinstance(image, str) or not image:
            raise BadLine("V* result has no image name")
        return Path(image).name
    value = result.get("question_id") if run.benchmark == "pope" else None
    value = result.get("idx") if value in (None, "") else value
    if value is None or isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise BadLine("result has no idx")
    return str(value)


def _score_only_draft(
    line: Mapping[str, Any], run: OfficialRun, score: float, accepted: bool
) -> dict[str, Any]:
    aggregation = AGGREGATION_NAMES.get(run.aggregation or "min", "min")
    draft: dict[str, Any] = {
        "text": _draft_text(line),
        "score": score,
        "accepted": accepted,
        "score_only": True,
        "aggregation": aggregation,
        "alpha": DEFAULT_ALPHA,
        "k": run.k,
    }
    if aggregation == "softmax":  # --mode log: the geometric mean of the top-1 probability
        draft["softmax_confidence"], draft["separability"] = score, None
    else:
        draft["separability"] = separability_of(score)  # score in (0, 1): checked above
    if accepted and isinstance(line.get("generated_length"), int):
        draft["generated_tokens"] = line["generated_length"]
    return draft
