"""The published prompts, verbatim, and how a query becomes a prompt.

Strings come from the official SpecEyes evaluation (MAC-AutoML/SpecEyes,
``eval_code_deepeyes/prompt.py`` and ``SpecEyes.py``), which produced the paper's numbers,
and from DeepEyes (Visual-Agent/DeepEyes) for the variant of its tool declaration it was
trained on. Whitespace is part of what the models saw, so it is kept exactly: the judge's
system prompt ends with a newline, and the question template keeps the eight-space
indentation of the triple-quoted strings in the published script (``style="published"``).
``tests/test_protocol.py`` checks the rendered prompts against fixtures byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEEPEYES_SYSTEM_PROMPT",
    "DEEPEYES_TRAINING_SYSTEM_PROMPT",
    "DEEPEYES_USER_PROMPT",
    "JUDGE_SYSTEM_PROMPT",
    "JUDGE_USER_SUFFIX",
    "NATIVE_AGENT_SYSTEM_PROMPT",
    "Prompts",
    "SPECREASON_VERIFY_PROMPT",
    "SPECULATOR_SYSTEM_PROMPT",
    "THYME_STOP",
    "THYME_SYSTEM_PROMPT",
    "format_question",
    "option_letters",
    "thyme_user_prompt",
    "tools_system_prompt",
]

JUDGE_SYSTEM_PROMPT = (
    "You decide based on answer reliability.\n\n"
    'Answer "yes" if using a tool would significantly improve correctness or confidence of the answer.\n\n'
    'Answer "no" if tools would add little or no value.\n\n'
    'Output only "yes" or "no".\n'
)
JUDGE_USER_SUFFIX = "\nWould tools significantly improve answer reliability? yes or no."

SPECULATOR_SYSTEM_PROMPT = (
    "You are a helpful assistant. Output only the final answer itself. Do not include "
    "explanations, reasoning, labels, or any extra text."
)
SPECULATOR_USER_SUFFIX = "\nAnswer:"

# The tool declaration of the published SpecEyes evaluation (the paper's numbers).
DEEPEYES_SYSTEM_PROMPT = 'You are a helpful assistant.\n\n# Tools\nYou may call one or more functions to assist with the user query.\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type":"function","function":{\n    "name":"image_zoom_in_tool",\n    "description":"Zoom in on a specific region of the input image by cropping it based on a bounding box (bbox) and an optional object label.",\n    "parameters":{\n        "type":"object",\n        "properties":{\n            "bbox_2d":{"type":"array","items":{"type":"number"},"minItems":4,"maxItems":4,"description":"The bounding box to zoom in, format: [x1, y1, x2, y2]."},\n            "label":{"type":"string","description":"Label of the object (optional)."}\n        },\n        "required":["bbox_2d"]\n    }\n}}\n</tools>\n\n# How to call a tool\nReturn a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n**Example**:  \n<tool_call>  \n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}}  \n</tool_call>\n'
DEEPEYES_TRAINING_SYSTEM_PROMPT = (  # DeepEyes' own training and evaluation
    "You are a helpful assistant.\n\n"
    "# Tools\n"
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type":"function","function":{"name":"image_zoom_in_tool","description":"Zoom in on a '
    "specific region of an image by cropping it based on a bounding box (bbox) and an optional "
    'object label.","parameters":{"type":"object","properties":{"bbox_2d":{"type":"array",'
    '"items":{"type":"number"},"minItems":4,"maxItems":4,"description":"The bounding box of the '
    "region to zoom in, as [x1, y1, x2, y2], where (x1, y1) is the top-left corner and (x2, y2) "
    'is the bottom-right corner."},"label":{"type":"string","description":"The name or label of '
    'the object in the specified bounding box (optional)."}},"required":["bbox"]}}}\n'
    "</tools>\n\n"
    "# How to call a tool\n"
    "Return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n\n"
    "**Example**:  \n"
    "<tool_call>  \n"
    '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}}  \n'
    "</tool_call>"
)
DEEPEYES_USER_PROMPT = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)

THYME_SYSTEM_PROMPT = (  # Kwai-Keye/Thyme-RL, as the SpecEyes Thyme evaluation sends it
    "You are a helpful assistant.\n"
    "\n"
    "Solve the following problem step by step, and optionally write Python code for image manipulation to enhance your reasoning process. The Python code will be executed by an external sandbox, and the processed image or result (wrapped in <sandbox_output></sandbox_output>) can be returned to aid your reasoning and help you arrive at the final answer.\n"
    "\n"
    "**Reasoning & Image Manipulation (Optional but Encouraged):**\n"
    "    * You have the capability to write executable Python code to perform image manipulations (e.g., cropping to a Region of Interest (ROI), resizing, rotation, adjusting contrast) or perform calculation for better reasoning.\n"
    "    * The code will be executed in a secure sandbox, and its output will be provided back to you for further analysis.\n"
    "    * All Python code snippets **must** be wrapped as follows:\n"
    "    <code>\n"
    "    ```python\n"
    "    # your code.\n"
    "    ```\n"
    "    </code>\n"
    "    * At the end of the code, print the path of the processed image (processed_path) or the result for further processing in a sandbox environment."
)
THYME_STOP = ("</code>", "</answer>")  # each generation step ends at code or an answer
SPECREASON_VERIFY_PROMPT = (  # the large model scores a drafted step 0-9 (SpecReason.py)
    "\n    Please evaluate the quality of the last reasoning step. Score from 0-9, where:\n"
    "    9: Perfect logic, directly helps solve the problem\n"
    "    7-8: Good logic, contributes to the solution\n"
    "    5-6: Neutral, doesn't hurt but doesn't help much\n"
    "    3-4: Problematic, may lead to confusion\n"
    "    0-2: Incorrect, misleading, or irrelevant\n"
    "    \n"
    "    Only output the score as a single digit.\n"
    "    "
)


def thyme_user_prompt(question_text: str, image_path: str, image_size: tuple[int, int]) -> str:
    """Thyme's first user turn (after the image): the question, where the sandbox finds the
    image and its original size, and the answer format. The leading ``<image>`` is literal
    text in the published prompt and is kept."""
    width, height = image_size
    return (
        f"<image>\n{question_text}\n\n"
        f'### User Image Path:** "{image_path}"\n'
        f'### User Image Size:** "{width}x{height}"\n\n'
        "### **Output Format (strict adherence required):**\n\n"
        "<think>Your detailed reasoning process, including any code, should go here.</think>\n"
        "<answer>Your final answer to the user's question goes here.</answer>\n"
    )


NATIVE_AGENT_SYSTEM_PROMPT = (
    "You are a helpful assistant that answers questions about images. If details are too "
    "small to see, call a tool to look closer. When you are sure, reply with the final "
    "answer inside <answer></answer>."
)


def option_letters(n: int) -> list[str]:
    return [chr(ord("A") + i) for i in range(n)]


QuestionStyle = Literal["published", "compact", "thyme"]


def format_question(
    question: str, options: Sequence[str] | None = None, style: QuestionStyle = "published"
) -> str:
    """The question block of every prompt.

    ``published`` is the SpecEyes script byte for byte, indentation artefacts included::

        "Question: {q}\\n        Options: \\nA. x\\nB. y\\n\\n        "   (no options: "Question: {q}\\n        ")

    ``compact`` drops the indentation (``"Question: {q}\\nOptions: \\nA. x\\nB. y\\n"``), as
    DeepEyes' own evaluation writes it; the demo checkpoints were trained on it.

    ``thyme`` is the SpecEyes Thyme evaluation's judge and draft block
    (``"Question: {q}\\nOptions:\\nA. x\\nB. y\\n"``); the Thyme agent adds a last line
    (:meth:`Prompts.agent_question`).
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the query needs a non-empty 'question' string, got {question!r}")
    listed = "".join(
        f"{letter}. {opt}\n"
        for letter, opt in zip(option_letters(len(options or [])), options or [])
    )
    if style == "compact":
        return (
            f"Question: {question}\nOptions: \n{listed}" if options else f"Question: {question}\n"
        )
    if style == "thyme":
        listed = "\n".join(
            f"{letter}. {opt}"
            for letter, opt in zip(option_letters(len(options or [])), options or [])
        )
        return (
            f"Question: {question}\nOptions:\n{listed}\n" if options else f"Question: {question}\n"
        )
    if style != "published":
        raise ValueError(f"unknown question style {style!r}; use 'published', 'compact' or 'thyme'")
    if not options:
        return f"Question: {question}\n        "
    return f"Question: {question}\n        Options: \n{listed}\n        "


def tools_system_prompt(tool_schemas: Sequence[dict[str, Any]]) -> str:
    """A DeepEyes-style system prompt declaring arbitrary tools (Qwen ``<tools>`` block).

    For the single ``image_zoom_in_tool`` the verbatim DeepEyes prompt is used instead.
    """
    names = [s.get("function", {}).get("name") for s in tool_schemas]
    if names == ["image_zoom_in_tool"]:
        return DEEPEYES_SYSTEM_PROMPT
    declared = "\n".join(json.dumps(s, separators=(",", ":")) for s in tool_schemas)
    return (
        "You are a helpful assistant.\n\n# Tools\nYou may call one or more functions to assist "
        "with the user query.\nYou are provided with function signatures within <tools></tools> "
        f"XML tags:\n<tools>\n{declared}\n</tools>\n\n# How to call a tool\nReturn a json object "
        "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(frozen=True)
class Prompts:
    """Every prompt the graph sends; override any field to adapt to another model."""

    judge_system: str = JUDGE_SYSTEM_PROMPT
    judge_suffix: str = JUDGE_USER_SUFFIX
    speculator_system: str = SPECULATOR_SYSTEM_PROMPT
    speculator_suffix: str = SPECULATOR_USER_SUFFIX
    agent_system: str | None = (
        None  # None: DeepEyes prompt (text protocol) or NATIVE_AGENT_SYSTEM_PROMPT
    )
    agent_suffix: str = DEEPEYES_USER_PROMPT
    tool_response_instruction: str = DEEPEYES_USER_PROMPT
    question_style: QuestionStyle = "published"
    # Thyme's agent question ends with one of these lines (published: options, and POPE's
    # yes/no questions; an open question gets none unless you set it)
    options_tail: str = "Please select the correct answer from the options above."
    open_tail: str = ""
    verify: str = SPECREASON_VERIFY_PROMPT  # SpecReason: the large model scores a step

    def question(self, question: str, options: Sequence[str] | None = None) -> str:
        return format_question(question, options, self.question_style)

    def agent_question(self, question: str, options: Sequence[str] | None = None) -> str:
        """The question as the agent sees it; Thyme's adds its last line."""
        text = self.question(question, options)
        if self.question_style == "thyme":
            text += self.options_tail if options else self.open_tail
            return text if options or self.open_tail else text.rstrip("\n")
        return text

    @classmethod
    def thyme(cls, **overrides: Any) -> Prompts:
        """The prompts of the published Thyme runs."""
        return cls(**{"question_style": "thyme", "agent_system": THYME_SYSTEM_PROMPT, **overrides})
