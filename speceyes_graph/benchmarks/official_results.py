"""Results of the published SpecEyes scripts, brought in as a run folder our tools read.

Teams run the authors' evaluation (``eval_code_deepeyes/SpecEyes.py``,
``eval_code_thyme/SpecEyes.py``, with or without ``--baseline``) on a GPU and get one JSON line
per query, in a file named ``{benchmark}_{split}_{large}_{small}_{batch}_{mode}_{threshold}.jsonl``
(``..._baseline_{batch}_None_None.jsonl`` for the large model alone). A line holds ``status``,
``judge_tc`` (the judge's "yes": tools needed), ``use_model`` (``small``: the draft was
accepted), ``confidence_score`` (``sigmoid(0.6 x S)`` of the ``mode`` aggregation, -1 when
no draft was made), ``small_answer``, ``generated_length`` and ``result`` (question, reference
answer, ``pred_ans``); DeepEyes lines add ``error`` and ``print_messages``, Thyme lines
``messages``.

What the files do not hold, and how this module copes:

- **No top-K log-probs.** A draft is known by its score alone: a *score-only* draft records
  its score, the aggregation, alpha and K the script used, and the separability the score
  implies (``logit(score) / alpha``). Tools that would re-aggregate (another aggregation, the
  softmax baseline) find no score for it rather than a made-up one.
- **Rejected drafts' text.** DeepEyes keeps it in ``print_messages`` (the assistant turn after
  the prompt); Thyme drops it, so those drafts' correctness is unknown (``draft_correct``
  None) and the labelled tools leave them out of what they claim.
- **Options.** V* lines carry only the right option's text; HR-Bench DeepEyes lines only the
  letter. The options are read from the prompt the line kept, else from the dataset
  (``data``), else (V*) the line is scored against the right option alone, and said so.
- **Per-query latency.** None is recorded (the folder's ``latency_summary.json`` has the wall
  time per file, which becomes the session's wall time); modelled speedups stay empty.

Correctness is our scorer's (:func:`.scoring.is_correct` on ``pred_ans``); the published rule's
verdict (:func:`.official.official_rule`, None where the scripts would ask their LLM grader)
is kept beside it as ``official_correct``. Lines that cannot be a record (an error, a missing
field, a score outside (0, 1) where a draft was made, a repeated query) are reported and
skipped; one bad line never stops an import.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..prompts import option_letters
from ..separability import DEFAULT_ALPHA, DEFAULT_K
from .official import official_rule
from .runner import RECORDS, _replace
from .scoring import is_correct

__all__ = [
    "BENCHMARK_NAMES",
    "BadLine",
    "ImportResult",
    "OfficialRun",
    "import_official",
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
        draft["separability"] = math.log(score / (1 - score)) / DEFAULT_ALPHA
    if accepted and isinstance(line.get("generated_length"), int):
        draft["generated_tokens"] = line["generated_length"]
    return draft


@dataclass
class ImportResult:
    """What an import wrote and what it set aside (line numbers are 1-based, per file)."""

    out: Path
    imported: Counter[str] = field(default_factory=Counter)  # per file
    skipped: list[dict[str, Any]] = field(default_factory=list)  # file, line, reason
    notes: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)


def _run_for(path: Path, overrides: Mapping[str, Any]) -> OfficialRun:
    found = parse_result_name(path)
    settings = {**found, **{k: v for k, v in overrides.items() if v is not None}}
    if settings.get("benchmark") not in SPLITS:
        raise ValueError(
            f"{path.name}: cannot tell the benchmark from the name; pass --benchmark vstar|hr|pope"
        )
    if not settings.get("split"):
        raise ValueError(f"{path.name}: cannot tell the split from the name; pass --split")
    mode = settings.get("mode") or "speceyes"
    if mode == "speceyes" and settings.get("tau") is None:
        raise ValueError(f"{path.name}: cannot tell the threshold from the name; pass --tau")
    return OfficialRun(
        benchmark=settings["benchmark"],
        split=settings["split"],
        mode=mode,
        aggregation=settings.get("aggregation") if mode == "speceyes" else None,
        tau=settings.get("tau") if mode == "speceyes" else None,
        k=int(settings.get("k") or DEFAULT_K),
        large_model=settings.get("large_model"),
        small_model=settings.get("small_model"),
        batch_size=settings.get("batch_size"),
        phase1_small=bool(settings.get("phase1_small")),
    )


def _wall_times(path: Path) -> float | None:
    """The scripts' ``latency_summary.json`` beside the file: wall seconds per file name."""
    summary = path.parent / "latency_summary.json"
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return None
    value = data.get(path.name) if isinstance(data, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _options_lookup(benchmark: str, data: Path) -> dict[tuple[str, str], list[str]]:
    """(split, key) -> options, from the dataset in its published layout (V*: by image file
    name, unshuffled as the scripts read it; HR-Bench: by row number, as the scripts count)."""
    from .datasets import load_hrbench, load_vstar

    lookup: dict[tuple[str, str], list[str]] = {}
    if benchmark == "vstar":
        for q in load_vstar(data, shuffle=False):
            lookup[(q.split, Path(q.image or "").name)] = list(q.options or [])
    elif benchmark == "hr":
        rows: Counter[str] = Counter()
        for q in load_hrbench(data):
            lookup[(q.split, str(rows[q.split]))] = list(q.options or [])
            rows[q.split] += 1
    return lookup


def import_official(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    benchmark: str | None = None,
    split: str | None = None,
    mode: str | None = None,
    aggregation: str | None = None,
    tau: float | None = None,
    data: str | Path | None = None,
) -> ImportResult:
    """Turn result files of one run (one file per split) into the run folder ``out_dir``.

    The folder is written whole (``records.jsonl``, ``run.json``; lines set aside go to
    ``import-skipped.jsonl``), so importing the same files again gives the same folder. A
    folder holding a run of our own is never overwritten."""
    out = Path(out_dir)
    if mode not in (None, "speceyes", "agent"):
        raise ValueError(f"mode must be speceyes or agent, got {mode!r}")
    if aggregation is not None and aggregation not in AGGREGATION_NAMES:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATION_NAMES)}")
    runs = [(Path(p), _run_for(Path(p), {
        "benchmark": benchmark, "split": split, "mode": mode, "aggregation": aggregation, "tau": tau,
    })) for p in paths]  # fmt: skip
    kinds = {(r.benchmark, r.mode, r.aggregation, r.tau) for _, r in runs}
    if len(kinds) > 1:
        raise ValueError(
            "these files are not one run (benchmark, mode, aggregation, threshold differ: "
            f"{sorted(map(str, kinds))}); import each run into its own folder"
        )
    if (out / RECORDS).exists():
        settings = _session_settings(out)
        if settings.get("source") != "official":
            raise ValueError(f"{out} holds a run that was not imported; choose another --out")
    lookups: dict[str, dict[tuple[str, str], list[str]]] = {}
    result = ImportResult(out)
    records: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    sessions = []
    for path, run in runs:
        if data is not None and run.benchmark not in lookups:
            lookups[run.benchmark] = _options_lookup(run.benchmark, Path(data))
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    try:
                        line = json.loads(raw)
                    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                        raise BadLine(f"not JSON ({exc.__class__.__name__})") from None
                    record = official_record(line, run, options_lookup=lookups.get(run.benchmark))
                    if record["id"] in seen:
                        raise BadLine(f"{record['id']} again (first in {seen[record['id']]})")
                except BadLine as exc:
                    result.skipped.append({"file": str(path), "line": number, "reason": str(exc)})
                    continue
                seen[record["id"]] = f"{path.name}:{number}"
                note = record["meta"].get("options_note")
                if note:
                    result.notes[note] += 1
                if record["draft"] is not None and record["draft_correct"] is None:
                    result.notes["draft text not kept: its correctness is unknown"] += 1
                result.imported[str(path)] += 1
                result.routes[record["route"]] += 1
                records.append(record)
        sessions.append(
            {
                "settings": _settings(run, runs, data),
                "mode": run.mode,
                "source_file": str(path),
                "written": result.imported[str(path)],
                **({"wall_s": wall} if (wall := _wall_times(path)) is not None else {}),
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    _replace(out / RECORDS, b"".join(json.dumps(r).encode() + b"\n" for r in records))
    _replace(out / "run.json", json.dumps({"sessions": sessions}, indent=2).encode())
    skipped = out / "import-skipped.jsonl"
    if result.skipped:
        _replace(skipped, b"".join(json.dumps(s).encode() + b"\n" for s in result.skipped))
    elif skipped.exists():
        skipped.unlink()
    return result


def _settings(
    run: OfficialRun, runs: Sequence[tuple[Path, OfficialRun]], data: Any
) -> dict[str, Any]:
    """``run.json`` settings as our runner writes them, plus where the run came from."""
    return {
        "benchmark": BENCHMARK_NAMES[run.benchmark],
        "mode": run.mode,
        "threshold": run.tau,
        "aggregation": AGGREGATION_NAMES.get(run.aggregation or "", None),
        "alpha": DEFAULT_ALPHA if run.mode == "speceyes" else None,
        "k": run.k if run.mode == "speceyes" else None,
        "schedule": "official",
        "source": "official",
        "variant": _variant(run.large_model),
        "models": {"large": run.large_model, "small": run.small_model},
        "batch_size": run.batch_size,
        "phase1_small_judge": run.phase1_small,
        "files": [str(p) for p, _ in runs],
        "data": str(data) if data is not None else None,
    }


def _variant(large: str | None) -> str | None:
    name = (large or "").lower()
    return "thyme" if "thyme" in name else "deepeyes" if "deepeyes" in name else None


def _session_settings(out: Path) -> dict[str, Any]:
    try:
        sessions = json.loads((out / "run.json").read_text()).get("sessions") or [{}]
        return dict(sessions[-1].get("settings") or {})
    except (OSError, ValueError, AttributeError):
        return {}
