"""Scripted models used across the graph tests."""

from __future__ import annotations

import json

import numpy as np
from langchain_core.messages import AIMessage

from speceyes_graph.models import ScriptedChatModel, fake_logprobs
from speceyes_graph.protocol import message_text


def question_of(messages) -> str:
    return "".join(message_text(m) for m in messages if m.type == "human")


def judge(rule):
    """rule: a fixed answer, or a function of the prompt text."""
    return ScriptedChatModel(
        respond=lambda msgs: rule(question_of(msgs)) if callable(rule) else rule
    )


def speculator(text="A", separability=9.0, logprobs=True):
    def respond(msgs):
        seps = separability(question_of(msgs)) if callable(separability) else separability
        meta = {"logprobs": fake_logprobs([text], [seps])} if logprobs else {}
        return AIMessage(content=text, response_metadata=meta)

    return ScriptedChatModel(respond=respond)


def deepeyes_agent(bbox=(10, 10, 60, 60), answer="B"):
    """Zooms once (DeepEyes text), then answers after seeing the tool response."""

    def respond(msgs):
        if "<tool_response>" in message_text(msgs[-1]):
            return f"<think>I see it now.</think><answer>{answer}</answer>"
        call = json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": list(bbox)}})
        return f"<think>Too small; zoom.</think><tool_call>\n{call}\n</tool_call>"

    return ScriptedChatModel(respond=respond)


# drafts with chosen separability (calibration, label-free tau, drift)
COMPETITORS = np.sort(np.random.default_rng(0).normal(0, 1, 63))[::-1]


def draft(separability):
    """A one-token draft whose separability is exactly ``separability``."""
    top1 = COMPETITORS.mean() + separability * (COMPETITORS.std() + 1e-6)
    return {"text": "A", "top_logprobs": [[float(top1), *map(float, COMPETITORS)]]}


def records_of(scores, key="draft"):
    return [{"id": f"q{i}", key: draft(s)} for i, s in enumerate(scores)]


def two_modes(rng, n, weights, means, sds):
    upper = rng.random(n) < weights[1]
    return np.where(upper, rng.normal(means[1], sds[1], n), rng.normal(means[0], sds[0], n))


def not_our_progress(stderr: str) -> list[str]:
    """The lines of a command's stderr that are not its own tqdm progress bars (library
    warnings, load reports): a command that prints nothing else gives []."""
    import re

    bar = re.compile(r"^[\w .-]{0,40}: *\d+%\|")
    lines = (line.strip() for part in stderr.split("\n") for line in part.split("\r"))
    return [line for line in lines if line and not bar.match(line)]
