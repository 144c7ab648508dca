"""The published scoring, reproduced: the rules of the SpecEyes judge scripts and their LLM grader.

``judge_code/judge_{vstar,hr,pope}.py`` score a prediction with string rules first and ask
an LLM grader (Qwen2.5-72B-Instruct behind vLLM, temperature 0) only when the rules cannot
decide. The rules, all case-sensitive, after taking the inside of a ``\\boxed{..}``:

- V*: one character: equal to the correct letter; two characters with a ".": the letter is
  in it; the whole ``"A. <option>"`` in the prediction: correct; else the grader, with
  ``"A. <option>"`` as the reference. (The published loader never shuffles, so the letter is
  always A; here it is the query's correct letter.)
- HR-Bench: one character: equal to the letter; two with a ".": the letter is in it; the
  letter anywhere in the prediction: correct (so any capital "A" matches A); else the grader,
  with the bare letter as the reference.
- POPE: same length as the answer: exactly equal ("Yes" against "yes" is wrong); else the
  grader.

The grader prompts are the published ones byte for byte, typos included ("Judement" for
V* and POPE); its reply counts as correct when it contains a "1" after "Judgement:" (V*,
POPE: else exactly "1"; HR-Bench: a "1" anywhere). :mod:`.scoring` is this package's own,
stricter scoring; ``speceyes report --scoring official`` uses this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..prompts import option_letters

__all__ = ["GRADER_PROMPTS", "GRADER_SYSTEM", "grade", "official_rule", "official_reference"]

GRADER_SYSTEM = "You are a helpful assistant."
GRADER_PROMPTS = {
    "vstar": "\nBelow are two answers to a question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question.  Determine whether these two answers are consistent.\nNote that [Model Answer] is consistent with [Standard Answer] whenever they are essentially the same. If the meaning is expressed in the same way, it is considered consistent, for example, 'pink' and 'it is pink'.\nIf they are consistent, Judement is 1; if they are different, Judement is 0. Just output Judement and don't output anything else.\n\n\n\n[Question]: Is the countertop tan or blue?\n[Standard Answer]: A. The countertop is tan.\n[Model_answer] : tan\nJudgement: 1\n\n\n\n[Question]: On which side of the picture is the barrier?\n[Standard Answer]: A. The barrier is on the left side of the picture.\n[Model_answer] : A\nJudgement: 1\n\n\n\n[Question]: Is the kite brown and large?\n[Standard Answer]: A. Yes, the kite is brown and large.\n[Model_answer] : Yes\nJudgement: 1\n\n\n\n[Question]: Are the spots on a giraffe?\n[Standard Answer]: A. No, the spots are on a banana.\n[Model_answer] : no\nJudgement: 1\n\n\n\n[Question]: Who is wearing pants?\n[Standard Answer]: A. The boy is wearing pants.\n[Model_answer] : C. The girl in the picture is wearing pants.\nJudgement: 0\n\n\n\n[Question]: Is the man phone both blue and closed?\n[Standard Answer]: A. Yes, the man phone is both blue and closed.\n[Model_answer] : No.\nJudgement: 0\n\n\n\n[Question]: What color is the towel in the center of the picture?\n[Standard Answer]: A. The towel in the center of the picture is blue.\n[Model_answer] : The towel in the center of the picture is pink.\nJudgement: 0\n\n\n\n[Question]: {question}\n[Standard Answer]: {ground_truth}\n[Model_answer] : {prediction}\nJudgement:",
    "pope": "\nBelow are two answers to a question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question.  Determine whether these two answers are consistent.\nNote that [Model Answer] is consistent with [Standard Answer] whenever they are essentially the same. If the meaning is expressed in the same way, it is considered consistent, for example, 'pink' and 'it is pink'.\nIf they are consistent, Judement is 1; if they are different, Judement is 0. Just output Judement and don't output anything else.\n\n\n\n[Question]: Is the countertop tan or blue?\n[Standard Answer]: A. The countertop is tan.\n[Model_answer] : tan\nJudgement: 1\n\n\n\n[Question]: On which side of the picture is the barrier?\n[Standard Answer]: A. The barrier is on the left side of the picture.\n[Model_answer] : A\nJudgement: 1\n\n\n\n[Question]: Is the kite brown and large?\n[Standard Answer]: A. Yes, the kite is brown and large.\n[Model_answer] : Yes\nJudgement: 1\n\n\n\n[Question]: Are the spots on a giraffe?\n[Standard Answer]: A. No, the spots are on a banana.\n[Model_answer] : no\nJudgement: 1\n\n\n\n[Question]: Who is wearing pants?\n[Standard Answer]: A. The boy is wearing pants.\n[Model_answer] : C. The girl in the picture is wearing pants.\nJudgement: 0\n\n\n\n[Question]: Is the man phone both blue and closed?\n[Standard Answer]: A. Yes, the man phone is both blue and closed.\n[Model_answer] : No.\nJudgement: 0\n\n\n\n[Question]: What color is the towel in the center of the picture?\n[Standard Answer]: A. The towel in the center of the picture is blue.\n[Model_answer] : The towel in the center of the picture is pink.\nJudgement: 0\n\n\n\n[Question]: {question}\n[Standard Answer]: {ground_truth}\n[Model_answer] : {prediction}\nJudgement:",
    "hrbench": "\nBelow are two answers to a question. Question is [Question], [Standard Answer] is the standard answer to the question, and [Model_answer] is the answer extracted from a model's output to this question. Determine whether these two answers are consistent.\nNote that [Model Answer] is consistent with [Standard Answer] whenever they are essentially the same. If the meaning is expressed in the same way, it is considered consistent, for example, 'pink' and 'it is pink'.\nIf they are consistent, Judgement is 1; if they are different, Judgement is 0. Just output Judgement and don't output anything else.\n\n\n\n[Question]: Is the countertop tan or blue?\n[Standard Answer]: A. The countertop is tan.\n[Model_answer] : tan\nJudgement: 1\n\n\n\n[Question]: On which side of the picture is the barrier?\n[Standard Answer]: A. The barrier is on the left side of the picture.\n[Model_answer] : A\nJudgement: 1\n\n\n\n[Question]: Is the kite brown and large?\n[Standard Answer]: A. Yes, the kite is brown and large.\n[Model_answer] : Yes\nJudgement: 1\n\n\n\n[Question]: Are the spots on a giraffe?\n[Standard Answer]: A. No, the spots are on a banana.\n[Model_answer] : no\nJudgement: 1\n\n\n\n[Question]: Who is wearing pants?\n[Standard Answer]: A. The boy is wearing pants.\n[Model_answer] : C. The girl in the picture is wearing pants.\nJudgement: 0\n\n\n\n[Question]: Is the man phone both blue and closed?\n[Standard Answer]: A. Yes, the man phone is both blue and closed.\n[Model_answer] : No.\nJudgement: 0\n\n\n\n[Question]: What color is the towel in the center of the picture?\n[Standard Answer]: A. The towel in the center of the picture is blue.\n[Model_answer] : The towel in the center of the picture is pink.\nJudgement: 0\n\n\n\n[Question]: {question}\n[Standard Answer]: {ground_truth}\n[Model_answer] : {prediction}\nJudgement:",
}
GRADER_PROMPTS["synthetic"] = GRADER_PROMPTS["vstar"]


def _unboxed(prediction: str) -> str:
    if "\\boxed" in prediction:
        return prediction.split("\\boxed{")[1].split("}")[0]
    return prediction


def official_reference(benchmark: str, expected: str, options: Sequence[str] | None) -> str:
    """What the published scripts compare against: ``"A. <option>"`` (V*), the letter (HR-Bench),
    the yes/no answer (POPE)."""
    if benchmark in ("vstar", "synthetic") and options:
        return f"{expected}. {options[option_letters(len(options)).index(expected)]}"
    return expected


def official_rule(
    benchmark: str, prediction: str | None, expected: str, options: Sequence[str] | None
) -> bool | None:
    """The published string rules: True / False, or None when only the grader can decide."""
    pred = _unboxed(prediction or "")
    reference = official_reference(benchmark, expected, options)
    if benchmark == "pope":
        return pred == reference if len(pred) == len(reference) else None
    if len(pred) == 1:
        return pred == expected
    if len(pred) == 2 and "." in pred:
        return expected in pred
    if benchmark == "hrbench":
        return True if expected in pred else None
    return True if reference in pred else None


def grade(chat_model: Any, benchmark: str, question: str, reference: str, prediction: str) -> bool:
    """Ask the grader model with the published prompt and read its verdict as published."""
    from langchain_core.messages import HumanMessage, SystemMessage

    prompt = (
        GRADER_PROMPTS[benchmark]
        .replace("{question}", question)
        .replace("{ground_truth}", reference)
        .replace("{prediction}", _unboxed(prediction))
    )
    reply = chat_model.invoke([SystemMessage(content=GRADER_SYSTEM), HumanMessage(content=prompt)])
    text = str(getattr(reply, "content", reply)).strip()
    if benchmark == "hrbench":
        if "Judgement:" in text:
            text = text.split("Judgement:")[-1].strip()
        return "1" in text
    if "Judgement:" in text:
        text = text.split("Judgement:")[-1].strip()
        return "1" in text
    return text == "1"
