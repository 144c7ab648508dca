"""Result files in the shapes the published SpecEyes scripts write, for the import tests.

Written for these tests, not taken from a run: the line layouts follow
``eval_code_deepeyes/SpecEyes.py`` and ``eval_code_thyme/SpecEyes.py`` (and their
``--baseline`` runs) field for field, including what they keep of each conversation, the file
names they choose and their ``latency_summary.json``; the numbers come from a simulation with
the shape of real drafts: on the separability scale a confident mode near 9 (mostly right)
and an unsure one near 5 (mostly wrong), about a third unsure.

    python tests/official_fixtures.py      rewrites tests/fixtures/official (deterministic)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

FOLDER = Path(__file__).resolve().parent / "fixtures" / "official"
LETTERS = "ABCD"
JUDGE_SYSTEM = "You decide based on answer reliability. (the published judge prompt)"
JUDGE_USER = (
    "\nWould zooming in on the image make your answer more reliable? Output only yes or no."
)
AGENT_SYSTEM = "You are a helpful assistant.\n\n# Tools\n(the published tool prompt)"
AGENT_USER = "\nThink first, call **image_zoom_in_tool** if needed, then answer."
WORDS = "red blue green white black yellow left right top bottom cat dog car sign lamp cup".split()


def _score(s: float) -> float:
    """sigmoid(0.6 * S) as the scripts store it: a float32 tensor's .item()."""
    return float(np.float32(1 / (1 + math.exp(-0.6 * s))))


def _query(bench: str, split: str, i: int, rng: np.random.Generator) -> dict:
    question = f"What is the {rng.choice(WORDS)} {rng.choice(WORDS)} near the {rng.choice(WORDS)}?"
    if bench == "pope":
        answer = "yes" if rng.random() < 0.5 else "no"
        return {"question": f"Is there a {rng.choice(WORDS)} in the image?", "answer": answer}
    n = 4 if bench == "hr" or rng.random() < 0.5 else 2
    words = list(rng.choice(WORDS, size=n, replace=False))
    options = [f"The object is {w}." for w in words]
    right = 0 if bench == "vstar" else int(rng.integers(n))
    return {"question": question, "options": options, "right": right}


def _reply(q: dict, bench: str, right: bool, rng: np.random.Generator, style: str) -> str:
    """A model's final answer, in one of the shapes real replies take."""
    if bench == "pope":
        said = q["answer"] if right else ("no" if q["answer"] == "yes" else "yes")
        return said.capitalize() if style == "small" else f"<answer>{said.capitalize()}</answer>"
    n = len(q["options"])
    pick = q["right"] if right else (q["right"] + 1 + int(rng.integers(n - 1))) % n
    letter = LETTERS[pick]
    if style == "small":
        return [letter, f"{letter}. {q['options'][pick]}", q["options"][pick]][int(rng.integers(3))]
    return f"<think>The {q['options'][pick].lower()}</think>\n<answer>{letter}. {q['options'][pick]}</answer>"


def _prompt(q: dict, bench: str, variant: str) -> str:
    if bench == "pope":
        return f"Question: {q['question']}\n        "
    if variant == "thyme":
        block = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(q["options"]))
        return f"Question: {q['question']}\nOptions:\n{block}\nPlease select the correct answer from the options above."
    block = "".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(q["options"]))
    return f"Question: {q['question']}\n        Options: \n{block}\n        "


def _result(q: dict, bench: str, variant: str, i: int, pred: str) -> dict:
    if bench == "vstar":
        image = f"sa_{1000 + i}.jpg"
        return {
            "image": image if variant == "thyme" else f"data/vstar/{q['split']}/{image}",
            "question": q["question"],
            "answer": q["options"][0],
            "pred_ans": pred,
        }
    if bench == "hr":
        out = {"idx": i, "question": q["question"]}
        if variant == "thyme":
            out["options"] = [f"{LETTERS[k]}. {o}" for k, o in enumerate(q["options"])]
        return out | {
            "answer": LETTERS[q["right"]],
            "answer_str": q["options"][q["right"]],
            "category": "single" if i % 2 else "cross",
            "pred_ans": pred,
        }
    return {
        "pid": str(i),
        "idx": i,
        "question_id": str(3000 + i),
        "question": q["question"],
        "answer": q["answer"],
        "image_source": f"COCO_val2014_{i:012d}",
        "category": q["split"],
        "pred_ans": pred,
    }


def _answer_of(text: str) -> str:
    if "<answer>" in text and "</answer>" in text:
        return text.split("<answer>")[1].split("</answer>")[0].strip()
    return text


def run_lines(
    bench: str,
    split: str,
    n: int,
    *,
    variant: str = "deepeyes",
    tau: float = 0.98,
    baseline: bool = False,
    unsure: float = 0.35,
    seed: int = 0,
) -> list[dict]:
    """One run's lines, in the order the script writes them (per batch of 6: accepted drafts
    first, then the large model's queries). The same seed gives the same queries and the same
    agent answers with or without ``baseline``."""
    rng = np.random.default_rng([seed, len(split), n])
    lines: list[dict] = []
    batch: list[tuple[int, dict]] = []
    for i in range(n):
        q = _query(bench, split, i, rng) | {"split": split}
        tools = rng.random() < (0.5 if bench == "vstar" else 0.3)
        confident = rng.random() >= unsure
        s = rng.normal(9.0, 1.2) if confident else rng.normal(5.0, 1.0)
        draft_right = rng.random() < (0.97 if confident else 0.3)
        agent_right = rng.random() < 0.85
        draft = _reply(q, bench, draft_right, rng, "small")
        agent = _reply(q, bench, agent_right, rng, "large")
        batch.append((i, dict(q=q, tools=tools, s=s, draft=draft, agent=agent)))
        if len(batch) == 6 or i == n - 1:
            lines += _batch_lines(batch, bench, variant, tau, baseline)
            batch = []
    return lines


def _batch_lines(batch, bench, variant, tau, baseline) -> list[dict]:
    small, large = [], []
    for i, b in batch:
        prompt = _prompt(b["q"], bench, variant)
        judged = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"}},
                    {"type": "text", "text": prompt + JUDGE_USER},
                ],
            },
        ]
        if baseline or b["tools"]:
            large.append((i, b, judged, "yes", -1))
            continue
        score = _score(b["s"])
        judged.append({"role": "assistant", "content": b["draft"]})
        if score > tau:
            small.append((i, b, judged, score))
        else:
            large.append((i, b, judged, "no", score))
    out = []
    for i, b, kept, score in small:
        line = {"status": "success", "error": "", "small_answer": b["draft"]}
        if variant == "thyme":
            line = {"status": "success", "messages": [], "small_answer": b["draft"]}
        line |= {
            "confidence_score": score,
            "use_model": "small",
            "generated_length": 1 + len(b["draft"]) // 4,
            "judge_tc": "no",
        }
        if variant == "deepeyes":
            line["print_messages"] = kept
        out.append(line | {"result": _result(b["q"], bench, variant, i, _answer_of(b["draft"]))})
    for i, b, kept, judge_tc, score in large:
        prompt = _prompt(b["q"], bench, variant)
        call = '<think>Zoom in.</think>\n<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 200, 240]}}</tool_call>'
        steps = [
            {"role": "assistant", "content": call},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<tool_response>"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"}},
                    {"type": "text", "text": AGENT_USER},
                    {"type": "text", "text": "</tool_response>"},
                ],
            },
            {"role": "assistant", "content": b["agent"]},
        ]
        user = {
            "role": "user",
            "content": [kept[1]["content"][0], {"type": "text", "text": prompt + AGENT_USER}],
        }
        if variant == "deepeyes":  # init_messages resets turns 0 and 1 in place, keeps the rest
            line = {
                "status": "success",
                "error": "",
                "small_answer": "",
                "confidence_score": score,
                "use_model": "large",
                "generated_length": 60 + len(b["agent"]),
                "judge_tc": judge_tc,
                "print_messages": [
                    {"role": "system", "content": AGENT_SYSTEM},
                    user,
                    *kept[2:],
                    *steps,
                ],
            }
        else:  # Thyme keeps its own conversation, without the rejected draft
            thyme_user = {
                "role": "user",
                "content": [{"type": "image", "image": ""}, {"type": "text", "text": prompt}],
            }
            line = {
                "status": "success",
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": AGENT_SYSTEM}]},
                    thyme_user,
                    *steps,
                ],
                "small_answer": "",
                "confidence_score": score,
                "use_model": "large",
                "generated_length": 60 + len(b["agent"]),
                "judge_tc": judge_tc,
            }
        out.append(line | {"result": _result(b["q"], bench, variant, i, _answer_of(b["agent"]))})
    return out


RUNS = [  # (variant, benchmark, split, n, tau, aggregation, seed, unsure share)
    ("deepeyes", "vstar", "direct_attributes", 36, 0.98, "min", 1, 0.35),
    ("deepeyes", "vstar", "relative_position", 24, 0.98, "min", 2, 0.35),
    ("deepeyes", "hr", "hr_bench_8k", 300, 0.98, "min", 3, 0.35),
    ("deepeyes", "hr", "hr_bench_4k", 200, 0.98, "min", 4, 0.6),  # moved: more unsure drafts
    ("deepeyes", "pope", "adversarial", 30, 0.98, "min", 5, 0.35),
    ("thyme", "vstar", "direct_attributes", 30, 0.95, "min", 6, 0.35),
    ("thyme", "hr", "hr_bench_4k", 30, 0.95, "mean", 7, 0.35),
    ("thyme", "pope", "random", 30, 0.95, "min", 8, 0.35),
]
LARGE = {"deepeyes": "DeepEyes-7B", "thyme": "Thyme-RL"}


def file_name(variant, bench, split, tau, aggregation, baseline=False) -> str:
    small = "baseline" if baseline else "Qwen3-VL-2B-Instruct"
    mode, thr = ("None", "None") if baseline else (aggregation, tau)
    return f"{bench}_{split}_{LARGE[variant]}_{small}_6_{mode}_{thr}.jsonl"


def bad_lines() -> list[str]:
    """Lines an import must report and skip, among good ones (DeepEyes, HR-Bench 8K)."""
    good = run_lines("hr", "hr_bench_8k", 12, seed=9)
    drafted = next(g for g in good if g["judge_tc"] == "no")
    bad = [
        dict(drafted, status="error", error="Error processing sample: CUDA out of memory"),
        {k: v for k, v in drafted.items() if k != "confidence_score"},
        {**drafted, "result": {k: v for k, v in drafted["result"].items() if k != "pred_ans"}},
        dict(drafted, confidence_score=1.0),
        dict(drafted, confidence_score=0.0),
        dict(drafted, confidence_score=-0.25),
        dict(drafted, confidence_score="0.99"),
        {**drafted, "result": {**drafted["result"], "idx": 10_000, "answer": "E)"}},
    ]
    rows = [json.dumps(g) for g in good]
    rows[3:3] = [json.dumps(b) for b in bad]
    rows[8:8] = ["{not json", json.dumps(["a", "list"]), json.dumps(good[0])]  # + a repeat
    return rows


def write(folder: Path = FOLDER) -> None:
    for variant, bench, split, n, tau, agg, seed, unsure in RUNS:
        for baseline in (False, True):
            sub = folder / (variant + ("-baseline" if baseline else ""))
            sub.mkdir(parents=True, exist_ok=True)
            lines = run_lines(
                bench,
                split,
                n,
                variant=variant,
                tau=tau,
                baseline=baseline,
                unsure=unsure,
                seed=seed,
            )
            name = file_name(variant, bench, split, tau, agg, baseline)
            (sub / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
            summary = sub / "latency_summary.json"
            times = json.loads(summary.read_text()) if summary.exists() else {}
            times[name] = round(n * (0.9 if baseline else 0.55), 4)
            summary.write_text(json.dumps(dict(sorted(times.items())), indent=4))
    bad = folder / "bad"
    bad.mkdir(parents=True, exist_ok=True)
    (bad / file_name("deepeyes", "hr", "hr_bench_8k", 0.98, "min")).write_text(
        "\n".join(bad_lines()) + "\n" + '{"status": "success", "torn'
    )


if __name__ == "__main__":
    write()
    print(f"wrote {FOLDER}")
