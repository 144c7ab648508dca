"""The DeepEyes text protocol: tool calls and answers parsed out of plain model text.

A DeepEyes-style model writes ``<think>..</think><tool_call>{json}</tool_call>`` or
``<answer>..</answer>``. Its text is untrusted input: JSON is parsed with ``json`` (never
``eval``, which the published scripts use), closing tags may be missing (they are often
the stop string), a turn may hold several calls, and names may be unknown. Each problem
becomes a message written for the model, the same wording the DeepEyes training
environment used, so the loop can tell the model what to fix.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ParsedTurn",
    "extract_answer",
    "format_tool_call",
    "message_text",
    "parse_deepeyes",
    "parse_judge",
    "parse_thyme",
]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?=</tool_call>|<tool_call>|$)", re.S)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
# Thyme: <code>```python ...```</code>, the closing tag optional (it is the stop string)
_CODE = re.compile(r"<code>\s*(?:```\s*)?(?:python\s*)?([\s\S]*?)\s*(?:```\s*)?(?:</code>|$)", re.I)


@dataclass
class ParsedTurn:
    """What one model turn asked for."""

    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # LangChain ToolCall dicts
    answer: str | None = None
    problems: list[str] = field(default_factory=list)  # messages for the model


def message_text(message: Any) -> str:
    """The text of a message (or string), joining text blocks of list content."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return "" if content is None else str(content)


def extract_answer(text: str) -> str | None:
    """The content of the last ``<answer>`` (closing tag optional), else None."""
    matches = _ANSWER.findall(text or "")
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def _decode_call(body: str) -> dict[str, Any]:
    body = _FENCE.sub("", body.strip())
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        # tolerate trailing text after the object (e.g. a stray "}" or prose), never eval
        start = body.find("{")
        if start < 0:
            raise
        obj, _ = json.JSONDecoder().raw_decode(body[start:])
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError('missing "name"')
    args = obj.get("arguments", obj.get("args", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError('"arguments" must be a JSON object')
    return {"name": name, "args": args}


def parse_deepeyes(text: str, known_tools: Collection[str] | None = None) -> ParsedTurn:
    """Parse one DeepEyes-format turn.

    An ``<answer>`` ends the loop, as in the DeepEyes evaluation code, so tool calls in the
    same turn are not executed. Calls to unknown tools are returned with a problem message
    and *not* as tool calls.
    """
    turn = ParsedTurn()
    text = text or ""
    visible = _THINK.sub("", text)  # calls "imagined" inside <think> are not calls
    turn.answer = extract_answer(visible)
    if turn.answer is not None:
        return turn
    for body in _TOOL_CALL.findall(visible):
        try:
            call = _decode_call(body)
        except (ValueError, json.JSONDecodeError) as exc:
            turn.problems.append(
                f"Error: Invalid tool call format: {body.strip()[:300]}. Error: {exc}"
            )
            continue
        if known_tools is not None and call["name"] not in known_tools:
            turn.problems.append(
                f"Error: Unknown tool name: {call['name']}. Available: {', '.join(sorted(known_tools))}"
            )
            continue
        turn.tool_calls.append({**call, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"})
    return turn


def format_tool_call(name: str, args: dict[str, Any]) -> str:
    """A tool call as DeepEyes writes it, for re-rendering calls a server already parsed."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def parse_thyme(text: str, tool_name: str = "python_sandbox") -> ParsedTurn:
    """Parse one Thyme generation step: an ``<answer>`` ends the loop; else the first
    ``<code>`` block (fenced or not, closing tag optional) becomes one call of the code tool,
    as the published harness runs only the first block. Neither is a problem for the
    caller: the published loop stops there."""
    turn = ParsedTurn()
    text = text or ""
    turn.answer = extract_answer(text)
    if turn.answer is not None:
        return turn
    match = _CODE.search(text)
    if match is None:
        turn.problems.append("no <code> and no <answer>")
        return turn
    code = match.group(1).strip()
    if not code:
        turn.problems.append("an empty <code> block")
        return turn
    turn.tool_calls.append(
        {
            "name": tool_name,
            "args": {"code": code},
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "tool_call",
        }
    )
    return turn


def parse_judge(text: str) -> bool:
    """True (tool-free) iff the judge's answer, lower-cased, starts with "no".

    This is the published rule; anything else, including an empty or garbled answer,
    routes to the agent loop (the safe default: it costs time, never accuracy). A leading
    ``<think>`` block is skipped.
    """
    visible = _THINK.sub("", text or "").strip().strip("\"'*`").lower()
    return visible.startswith("no")
