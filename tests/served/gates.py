"""Online-gated graphs a test server loads by path (``tests/served/langgraph.json`` for
``langgraph dev``, ``tests/aegra_cluster.py`` for Aegra), each with a gate of its own in the
server's store (signed with ``SPECEYES_GATE_KEY``):

- ``guarded``: the served demo models behind an online gate that starts at tau 1.0 and does
  not move for a thousand queries: every draft is rejected and labelled within its run, so
  a client sees exactly what the gate counts (``draft.gate_counts``).
- ``fair_share``: scripted models for issue 75's attacks, behind the deployment's
  allow-list of client settings (``SPECEYES_CLIENT_SETTINGS``): the judge sends a question
  that says ``needs-tools`` to the agent, the draft's separability is in the question
  (``sep=5``: rejected at the gate's fixed 0.98; ``sep=9``: accepted, always shadowed), the
  agent answers "A", or zooms without end on a question that says ``zoom-forever`` (its step
  limit, 2, stops it). A window of 40, at most 4 from any one source (``max_share`` 0.1):
  ``draft.gate_counts`` of a probe run shows what the gate counts.
- ``failing_shadows``: scripted models (the draft's separability is in the question, the
  agent answers "A"; it raises on a question that says ``broken``, which only shadow runs
  meet while drafts are accepted) behind a gate seeded to accept such drafts, for the
  gate's reaction when shadows stop labelling.

Paths are the server's working directory's: run it from the repository root."""

from __future__ import annotations

import re

from langchain_core.messages import AIMessage, BaseMessage

from speceyes_graph import create_speceyes_graph
from speceyes_graph.agents.loop import LoopOptions
from speceyes_graph.gate.online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from speceyes_graph.gate.separability import GateConfig
from speceyes_graph.integrations.studio import client_settings, served_models, served_store
from speceyes_graph.models.scripted import ScriptedChatModel, fake_logprobs
from speceyes_graph.protocol import message_text
from speceyes_graph.settings import Limits


def _question(messages: list[BaseMessage]) -> str:
    return " ".join(message_text(m) for m in messages if m.type == "human")


def _draft(messages: list[BaseMessage]) -> AIMessage:
    found = re.search(r"sep=([0-9.]+)", _question(messages))
    separability = float(found.group(1)) if found else 0.0
    return AIMessage(
        content="A", response_metadata={"logprobs": fake_logprobs(["A"], [separability])}
    )


def _agent(messages: list[BaseMessage]) -> str:
    if "broken" in _question(messages):
        raise RuntimeError("the agent fails in the background")
    if "zoom-forever" in _question(messages):
        call = '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 20, 20]}}'
        return f"<think>look closer</think><tool_call>{call}</tool_call>"
    return "<think>ok</think><answer>A</answer>"


def _judge(messages: list[BaseMessage]) -> str:
    return "yes" if "needs-tools" in _question(messages) else "no"


models = served_models()
guarded = create_speceyes_graph(
    **{
        **models,
        "gate": OnlineGate(
            0.02,
            config=models.get("gate") or GateConfig(),
            tau=1.0,
            risk=RiskOptions(warmup=1000),
            trust=TrustOptions(namespace="guarded"),
        ),
    },
    store=served_store(),
    on_error="record",
).compile(name="guarded")

fair_share = create_speceyes_graph(
    judge=ScriptedChatModel(respond=_judge),
    speculator=ScriptedChatModel(respond=_draft),
    agent=ScriptedChatModel(respond=_agent),
    gate=OnlineGate(
        0.05,
        1.0,
        tau=0.98,
        risk=RiskOptions(window=40, warmup=40),
        labels=LabelOptions(seed=0),
        trust=TrustOptions(namespace="fair_share", max_share=0.1),
    ),
    loop=LoopOptions(max_steps=2),
    limits=Limits(client_settings=client_settings()),
    store=served_store(),
    on_error="record",
).compile(name="fair_share")

failing_shadows = create_speceyes_graph(
    judge=ScriptedChatModel(respond=lambda messages: "no"),
    speculator=ScriptedChatModel(respond=_draft),
    agent=ScriptedChatModel(respond=_agent),
    # a gate file's evidence: 300 labelled drafts at separability 9 that agreed, so it
    # accepts such drafts from the first query, its bound far from the target
    gate=OnlineGate(
        0.1,
        0.5,
        evidence=[(9.0, False)] * 300,
        labels=LabelOptions(seed=0),
        trust=TrustOptions(outage_tau=1.0, namespace="failing_shadows"),
    ),
    store=served_store(),
    on_error="record",
).compile(name="failing_shadows")
