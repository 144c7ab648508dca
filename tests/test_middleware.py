"""SpecEyesMiddleware in front of LangChain's own ``create_agent``: an accepted draft is the
agent's reply with no agent model call and no tool run; otherwise the agent's loop runs as
it would without the middleware; each human turn of a thread is judged alone; sync, async and
streamed runs agree; a failing phase never fails the agent; a gate file and the online gate
work; nothing the thread stores holds pixels; the package's tools read the turn's images.
Scripted models: the judge's verdicts and the drafts' scores are chosen by the question."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from checkpoint_pixels import describe, leaks, saver_rows
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelCallLimitMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from helpers import question_of, speculator
from speceyes_graph import (
    GateConfig,
    ImageStoreMiddleware,
    LabelOptions,
    OnlineGate,
    RiskOptions,
    SpecEyesMiddleware,
)
from speceyes_graph.integrations.middleware import pixel_free_agent
from speceyes_graph.models import ScriptedChatModel
from speceyes_graph.protocol import message_text
from speceyes_tools.vision import make_crop_tool, make_zoom_tool

# the question says what the scripted models do: "tiny" needs tools, "unsure" drafts weakly
BIG, TINY, UNSURE = "What colour is the big square?", "What colour is the tiny square?", "unsure?"


def large_model(answer="red", fail_judge=False):
    """Judges ("yes" for tiny things), then zooms once and answers after the crop."""

    def respond(msgs):
        text = question_of(msgs)
        if "yes or no" in text:
            if fail_judge:
                raise RuntimeError("the judge's server is down")
            return "yes" if "tiny" in text else "no"
        if any(isinstance(m, ToolMessage) for m in msgs):
            return f"<answer>{answer}</answer>"
        call = {"name": "zoom", "args": {"bbox": [80, 80, 220, 220]}, "id": "call-1"}
        return AIMessage(content="", tool_calls=[call])

    return ScriptedChatModel(respond=respond)


def small_model(fail=False):
    model = speculator("blue", lambda q: 5.0 if "unsure" in q else 9.0)
    if fail:
        model.respond = lambda msgs: (_ for _ in ()).throw(RuntimeError("the small model is down"))
    return model


def turn(scene, question, image=True):
    content = [{"type": "text", "text": question}]
    if image:
        data = base64.b64encode(open(scene, "rb").read()).decode()
        content.insert(0, {"type": "image", "base64": data, "mime_type": "image/png"})
    return {"messages": [HumanMessage(content=content)]}


def agent_of(large, small, tools=None, **kw):
    middleware = kw.pop("middleware", None) or [SpecEyesMiddleware(small, **kw)]
    return create_agent(large, tools if tools is not None else [make_zoom_tool()], middleware=middleware)


def counted_zoom():
    calls = []
    zoom = make_zoom_tool()

    @tool("zoom")
    def spy(bbox: list[float]) -> str:
        """Zoom in on a region of the image."""
        calls.append(bbox)
        return "zoomed"

    return spy, calls, zoom


def test_an_accepted_draft_is_the_reply_no_agent_call_no_tool(scene):
    large, small = large_model(), small_model()
    spy, calls, _ = counted_zoom()
    out = agent_of(large, small, tools=[spy]).invoke(turn(scene, BIG))
    reply = out["messages"][-1]
    assert [m.type for m in out["messages"]] == ["human", "ai"]
    assert reply.content == "blue" and not reply.tool_calls
    meta = reply.response_metadata["speceyes"]
    assert meta["route"] == "speculative" and meta["tau"] == 0.98 and meta["score"] > 0.98
    assert large.calls == 1 and small.calls == 1  # the judge's call only; no agent turn
    assert calls == []  # no tool ran
    record = out["speceyes"]
    assert record["route"] == "speculative" and record["judge_output"] == "no"
    assert record["draft"]["accepted"] and "tokens" not in record["draft"]  # the reply has it


def sent(messages):
    """What a model call was sent (message ids are fresh in every run)."""
    return [(m.type, m.content, getattr(m, "tool_calls", None)) for m in messages]


def test_a_rejected_draft_leaves_the_agents_loop_as_it_was(scene):
    """The agent's model calls receive exactly what they receive without SpecEyes (the same
    agent with only the image handling), and the tools run as they did."""
    with_speceyes, without = large_model(), large_model()
    out = agent_of(with_speceyes, small_model()).invoke(turn(scene, "unsure? " + BIG))
    plain = agent_of(without, None, middleware=[ImageStoreMiddleware()]).invoke(
        turn(scene, "unsure? " + BIG)
    )
    assert out["speceyes"]["route"] == "rejected-agentic"
    assert out["speceyes"]["draft"]["accepted"] is False and out["speceyes"]["draft"]["score"] < 0.98
    agent_calls = [m for m in with_speceyes.received if "yes or no" not in question_of(m)]
    assert list(map(sent, agent_calls)) == list(map(sent, without.received))
    assert len(agent_calls) == 2
    # a model that cannot read the image store is sent the image itself, never a store key
    first_turn = agent_calls[0][-1].content
    assert any(b.get("base64") for b in first_turn) and "blob://" not in str(first_turn)
    assert [m.type for m in out["messages"]] == [m.type for m in plain["messages"]]
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][-1].content == "<answer>red</answer>"


def test_a_turn_the_judge_sends_to_the_tools_is_never_drafted(scene):
    large, small = large_model(), small_model()
    out = agent_of(large, small).invoke(turn(scene, TINY))
    assert out["speceyes"]["route"] == "judged-agentic" and out["speceyes"]["draft"] is None
    assert small.calls == 0 and large.calls == 3  # judge, zoom, answer
    tool_message = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert "region [" in message_text(tool_message)  # our zoom tool read the turn's image


def test_each_human_turn_of_a_thread_is_judged_alone(scene):
    large, small = large_model(), small_model()
    agent = create_agent(
        large,
        [make_zoom_tool()],
        middleware=[SpecEyesMiddleware(small)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t"}}
    first = agent.invoke(turn(scene, TINY), config)
    second = agent.invoke(turn(scene, BIG, image=False), config)  # a follow-up: same image
    assert first["speceyes"]["route"] == "judged-agentic"
    assert second["speceyes"]["route"] == "speculative"
    judged = [question_of(m) for m in large.received if "yes or no" in question_of(m)]
    assert len(judged) == 2 and "big" in judged[1] and "tiny" not in judged[1]
    second_judge = [m for m in large.received if "yes or no" in question_of(m)][1]
    assert any(b.get("type") == "image" for b in second_judge[-1].content)  # the earlier image
    assert [m.type for m in second["messages"]] == ["human", "ai", "tool", "ai", "human", "ai"]


def test_sync_async_and_streamed_runs_agree(scene):
    agent = agent_of(large_model(), small_model())
    questions = [BIG, TINY, "unsure? " + BIG]

    def summary(out):
        return out["speceyes"]["route"], message_text(out["messages"][-1])

    sync = [summary(agent.invoke(turn(scene, q))) for q in questions]

    async def both():
        return [summary(await agent.ainvoke(turn(scene, q))) for q in questions]

    assert asyncio.run(both()) == sync
    assert sync == [("speculative", "blue"), ("judged-agentic", "<answer>red</answer>"),
                    ("rejected-agentic", "<answer>red</answer>")]  # fmt: skip
    # stream_mode="messages": the reply, never the judge's "no" or the draft being written
    streamed = [m for m, _ in agent.stream(turn(scene, BIG), stream_mode="messages")]
    assert [(m.type, m.content) for m in streamed] == [("AIMessageChunk", "blue")]  # its token
    streamed = [m for m, _ in agent.stream(turn(scene, TINY), stream_mode="messages")]
    assert [m.type for m in streamed] == ["ai", "tool", "ai"]


def test_a_failing_phase_or_image_never_fails_the_agent(scene, tmp_path):
    out = agent_of(large_model(fail_judge=True), small_model()).invoke(turn(scene, BIG))
    assert out["speceyes"]["route"] == "judged-agentic" and "judge's server" in out["speceyes"]["error"]
    assert out["messages"][-1].content == "<answer>red</answer>"
    out = agent_of(large_model(), small_model(fail=True)).invoke(turn(scene, BIG))
    assert out["speceyes"]["route"] == "rejected-agentic"
    assert "small model is down" in out["speceyes"]["draft"]["error"]
    assert out["messages"][-1].content == "<answer>red</answer>"
    broken = tmp_path / "broken.png"
    broken.write_bytes(open(scene, "rb").read()[:200])  # a truncated PNG
    out = agent_of(large_model(), small_model(), tools=[]).invoke(turn(str(broken), BIG))
    assert out["speceyes"]["route"] is None and "not speculated" in out["speceyes"]["error"]
    no_image = agent_of(large_model(), small_model(), tools=[]).invoke(turn(scene, BIG, image=False))
    assert no_image["speceyes"]["route"] is None and "no image" in no_image["speceyes"]["error"]


def test_a_gate_file_from_calibrate(scene, tmp_path):
    gate_file = tmp_path / "gate.json"
    gate_file.write_text(json.dumps({"gate": {"tau": 0.999, "k": 64, "aggregation": "min"}}))
    out = agent_of(large_model(), small_model(), gate=str(gate_file)).invoke(turn(scene, BIG))
    assert out["speceyes"]["route"] == "rejected-agentic"  # 0.9955 does not clear 0.999
    assert 0.98 < out["speceyes"]["draft"]["score"] < 0.999


def test_the_online_gate_gets_every_label(scene):
    """Accepted drafts are observed (shadowed ones labelled by a shadow agent off the user's
    path), rejected ones labelled by the agent's answer, tool turns counted without a draft."""
    gate = OnlineGate(
        0.05, 1.0, tau=0.98, risk=RiskOptions(window=1000, warmup=1000), labels=LabelOptions(seed=0)
    )  # tau stays 0.98
    shadow = create_agent(large_model(answer="blue"), [make_zoom_tool()], middleware=[ImageStoreMiddleware()])
    agent = agent_of(large_model(answer="red"), small_model(), gate=gate, shadow=shadow)
    routes = [agent.invoke(turn(scene, q))["speceyes"]["route"] for q in (BIG, "unsure? " + BIG, TINY)]
    assert routes == ["speculative", "rejected-agentic", "judged-agentic"]
    assert gate.shadows.drain(30)
    seen = sorted(gate.ledger.recent(), key=lambda o: o.at)
    assert len(seen) == 3
    accepted, rejected, tools = seen
    assert accepted.accepted and accepted.shadowed and accepted.disagrees is False  # blue == blue
    assert not rejected.accepted and rejected.disagrees is True  # the draft said blue, agent red
    assert tools.score is None
    assert gate.state()["shadow_runs"]["labelled"] == 1


def test_nothing_the_thread_stores_holds_pixels(scene):
    """With pixel_free_agent, LangGraph's record of each input holds keys too; without it
    that record keeps the pasted image (the guard finds it: it can fail)."""
    found = {}
    for wrapped in (False, True):
        saver = InMemorySaver()
        agent = create_agent(
            large_model(), [make_zoom_tool()], middleware=[SpecEyesMiddleware(small_model())],
            checkpointer=saver,
        )  # fmt: skip
        if wrapped:
            agent = pixel_free_agent(agent)
        for q in (TINY, BIG):
            agent.invoke(turn(scene, q), {"configurable": {"thread_id": "t"}})
        found[wrapped] = describe(leaks(saver_rows(saver)))
        state = agent.get_state({"configurable": {"thread_id": "t"}}).values
        assert "base64" not in json.dumps([m.model_dump() for m in state["messages"]])
    # without it: per turn the input record, its write to messages, the first messages
    # checkpoint (docs/quickstart.md gives the figures)
    assert len(found[False]) == 6 and sum("channel=messages" in row for row in found[False]) == 4
    assert found[True] == []


def test_the_packages_tools_read_the_turns_image_in_any_messages_agent(tmp_path):
    """No middleware at all: zoom, crop and OCR find the pasted image in the agent's
    messages (one turn calls all three)."""
    import cv2
    import numpy as np

    from speceyes_tools.tesseract import make_ocr_tool
    from speceyes_tools.vision import make_crop_tool

    image = np.full((240, 640, 3), 255, np.uint8)
    cv2.putText(image, "SPECEYES", (40, 150), cv2.FONT_HERSHEY_SIMPLEX, 3, (0, 0, 0), 8)
    path = tmp_path / "sign.png"
    cv2.imwrite(str(path), image)
    box = [0, 0, 640, 240]
    calls = [{"name": n, "args": {"bbox": box}, "id": n} for n in ("zoom", "crop", "ocr")]

    def respond(msgs):
        if isinstance(msgs[-1], ToolMessage):
            return "<answer>done</answer>"
        return AIMessage(content="", tool_calls=calls)

    tools = [make_zoom_tool(), make_crop_tool(), make_ocr_tool()]
    out = create_agent(ScriptedChatModel(respond=respond), tools).invoke(turn(str(path), "Read it"))
    results = {m.name: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert set(results) == {"zoom", "crop", "ocr"}
    assert all(r.status != "error" for r in results.values()), results
    for name in ("zoom", "crop"):
        assert any(b.get("type") == "image" for b in results[name].content)
    assert "SPECEYES" in message_text(results["ocr"]).replace(" ", "").upper()


class Seen(AgentMiddleware):
    """Another middleware around the model: what reaches it and what comes back."""

    def __init__(self):
        super().__init__()
        self.replies = []

    def wrap_model_call(self, request, handler):
        response = handler(request)
        self.replies.append(response.result[-1].content)
        return response


def test_in_a_middleware_stack(scene):
    outer = Seen()
    limit = ModelCallLimitMiddleware(run_limit=3)
    agent = create_agent(
        large_model(), [make_zoom_tool()],
        middleware=[outer, SpecEyesMiddleware(small_model()), limit],
    )  # fmt: skip
    assert agent.invoke(turn(scene, BIG))["messages"][-1].content == "blue"
    assert agent.invoke(turn(scene, TINY))["messages"][-1].content == "<answer>red</answer>"
    assert outer.replies == ["blue", "", "<answer>red</answer>"]


@pytest.mark.parametrize("bad", ["not-a-model", 3])
def test_the_speculator_must_be_a_chat_model(bad):
    with pytest.raises((TypeError, AttributeError)):
        SpecEyesMiddleware(bad)


# --- the same answers as the graph, on the demo checkpoints -----------------------------------


def test_create_agent_with_the_middleware_answers_as_the_graph_does(demo_queries_60):
    """``create_agent`` + SpecEyesMiddleware + our tools against ``create_speceyes_graph`` with
    the native protocol, on 60 demo queries: the same route and the same answer for each.
    tau 0.9945 sits in a gap of the drafts' scores (0.99427 | 0.99452), so some drafts are
    accepted and some rejected, and every route is compared. One request per generate call:
    a batched call's scores also depend on which requests share it, in the last bits."""
    from speceyes_graph import LoopOptions, create_speceyes_graph
    from speceyes_graph.agents.loop import agent_system_prompt
    from speceyes_graph.agents.toolsets import build_tools, load_toolset
    from speceyes_graph.demo import DEMO_PROMPTS, demo_models
    from speceyes_graph.protocol import extract_answer
    from speceyes_tools.images import default_store

    models = demo_models(batch_size=1)
    small, large = models["small"], models["large"]
    strict = GateConfig(tau=0.9945)
    loop = LoopOptions(protocol="native", max_steps=4, tool_response_text=True, explain_problems=True)
    graph = create_speceyes_graph(
        speculator=small, agent=large, prompts=DEMO_PROMPTS, gate=strict, loop=loop
    ).compile()
    expected = graph.batch(demo_queries_60, {"max_concurrency": 16})

    tools = build_tools(load_toolset("deepeyes"), resize=large.resize_spec, store=default_store())
    agent = create_agent(
        large,
        tools,
        system_prompt=agent_system_prompt("native", DEMO_PROMPTS, tools),
        middleware=[SpecEyesMiddleware(small, prompts=DEMO_PROMPTS, gate=strict)],
    )

    def as_a_user_writes_it(q):
        data = base64.b64encode(open(q["images"][0], "rb").read()).decode()
        text = DEMO_PROMPTS.question(q["question"], q["options"])  # "Question: ...\nOptions: ..."
        image = {"type": "image", "base64": data, "mime_type": "image/png"}
        return {"messages": [HumanMessage(content=[image, {"type": "text", "text": text}])]}

    outs = agent.batch([as_a_user_writes_it(q) for q in demo_queries_60], {"max_concurrency": 16})
    got = []
    for out in outs:
        text = message_text(out["messages"][-1])
        got.append((out["speceyes"]["route"], extract_answer(text) or text.strip() or None))
    want = [(e["route"], e["answer"]) for e in expected]
    assert {r for r, _ in want} == {"speculative", "rejected-agentic", "judged-agentic"}
    assert got == want


def _pasted(kind: str, scene: str) -> dict:
    png = open(scene, "rb").read()
    data = {
        "bad padding": "aGVsbG8",
        "not base64": "this is not base64 at all!",
        "not an image": base64.b64encode(b"plain text, not a picture").decode(),
        "truncated": base64.b64encode(png[:300]).decode(),
        # a length that needs padding (a byte after IEND, which decoders ignore), then lost
        "padding lost": base64.b64encode(png + b"\0" * (len(png) % 3 == 0)).decode().rstrip("="),
    }.get(kind)
    if data is not None:
        return {"type": "image", "base64": data, "mime_type": "image/png"}
    if kind == "url not allowed":
        return {"type": "image", "url": "http://127.0.0.1:9/x.png"}
    assert kind == "too large"
    return {"type": "image", "base64": base64.b64encode(png).decode(), "mime_type": "image/png"}


@pytest.mark.parametrize(
    "kind",
    [
        "bad padding",
        "not base64",
        "not an image",
        "truncated",
        "too large",
        "url not allowed",
        "padding lost",
    ],
)
def test_an_unreadable_pasted_image_gets_a_clear_note_and_the_thread_goes_on(scene, kind):
    """A pasted image the store cannot read (issue 55): the turn is answered by the agent,
    the human message keeps a note saying why in the image's place (so no later turn trips
    on it), and the next turn of the thread is served as usual. Before, bad base64 raised
    from before_agent, and the stuck message failed every later turn."""
    from speceyes_tools.images import ImagePolicy, ImageStore

    policy = ImagePolicy.strict(max_pixels=10_000) if kind == "too large" else ImagePolicy.strict()
    store = ImageStore(policy=policy)
    saver = InMemorySaver()
    agent = create_agent(
        large_model(), [make_zoom_tool()],
        middleware=[SpecEyesMiddleware(small_model(), store=store)], checkpointer=saver,
    )  # fmt: skip
    thread = {"configurable": {"thread_id": kind}}
    first = agent.invoke(
        {"messages": [HumanMessage(content=[_pasted(kind, scene), {"type": "text", "text": BIG}])]},
        thread,
    )
    asked = first["messages"][0].content
    assert isinstance(first["messages"][-1], AIMessage)
    if kind == "padding lost":  # a real image: read as meant
        assert first["speceyes"]["route"] == "speculative"
        assert asked[0]["url"].startswith("blob://")
    else:
        notes = [
            b["text"] for b in asked if b.get("type") == "text" and "could not be read" in b["text"]
        ]
        assert len(notes) == 1 and not [b for b in asked if b.get("type") != "text"], asked
        assert not [b for b in asked if set(b) & {"base64", "data", "url"}]  # no image kept
    if kind in ("too large", "url not allowed"):  # the note says why
        assert ("the limit is" if kind == "too large" else "not accepted here") in notes[0], notes
    store.policy = ImagePolicy.strict()  # the next image fits
    second = agent.invoke(turn(scene, BIG), thread)
    assert second["speceyes"]["route"] == "speculative" and second["messages"][-1].content == "blue"


@pytest.mark.parametrize("order", ["speceyes first", "pii first"])
def test_the_record_holds_no_text_a_redaction_middleware_cannot_see(scene, order):
    """LangChain's PIIMiddleware redacts e-mail addresses in the messages; the SpecEyes
    record (the state's ``speceyes`` key, in every checkpoint) keeps no model-written text
    for it to miss, for an accepted draft and a rejected one, in either order (issue 55).
    The rejected draft still gets its online-gate label from the agent's answer."""
    from langchain.agents.middleware import PIIMiddleware

    address = "ann.smith@example.com"
    small = speculator(f"mail {address}", lambda q: 5.0 if "unsure" in q else 9.0)
    gate = OnlineGate(
        0.05, 0.1, tau=0.98, risk=RiskOptions(warmup=1000), labels=LabelOptions(seed=0)
    )
    speceyes = SpecEyesMiddleware(small, gate=gate)
    pii = PIIMiddleware("email", strategy="redact", apply_to_output=True)
    saver = InMemorySaver()
    agent = create_agent(
        large_model(), [make_zoom_tool()], checkpointer=saver,
        middleware=[speceyes, pii] if order == "speceyes first" else [pii, speceyes],
    )  # fmt: skip
    thread = {"configurable": {"thread_id": "t"}}
    routes = [agent.invoke(turn(scene, q), thread)["speceyes"]["route"] for q in (BIG, "unsure? " + BIG)]
    assert routes == ["speculative", "rejected-agentic"]
    history = [s.values.get("speceyes") for s in agent.get_state_history(thread)]
    assert address not in json.dumps(history, default=str)
    rows = [r for r in saver_rows(saver) if r.channel == "speceyes"]
    assert rows and not [r for r in rows if address.encode() in r.data]
    records = [h for h in history if h and h.get("draft")]
    assert records and all("text" not in h["draft"] and "score" in h["draft"] for h in records)
    assert gate.shadows.drain(30)
    [rejected] = [o for o in gate.ledger.recent() if not o.accepted]
    assert rejected.disagrees is True  # the agent said red, the draft an address


def test_the_record_keeps_the_text_when_asked(scene):
    out = agent_of(large_model(), small_model(), record_text=True).invoke(turn(scene, BIG))
    assert out["speceyes"]["draft"]["tokens"] == ["blue"] and out["speceyes"]["draft"]["text"] == "blue"


def test_retries_and_fallbacks_around_it_judge_and_draft_once_per_turn(scene):
    """LangChain's ModelRetryMiddleware and ModelFallbackMiddleware call the model call
    again for the same turn: SpecEyes inside them judges and drafts once, and the route is
    the same whichever order they are stacked in (issue 55)."""
    from langchain.agents.middleware import ModelFallbackMiddleware, ModelRetryMiddleware

    def flaky_large():
        model = large_model()
        inner, failed = model.respond, []

        def respond(msgs):
            if "yes or no" not in question_of(msgs) and not failed:
                failed.append(1)
                raise RuntimeError("the agent's server hiccuped")
            return inner(msgs)

        model.respond = respond
        return model

    for order in ("retry outside", "retry inside"):
        large, small = flaky_large(), small_model()
        retry = ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
        speceyes = SpecEyesMiddleware(small)
        stack = [retry, speceyes] if order == "retry outside" else [speceyes, retry]
        out = create_agent(large, [make_zoom_tool()], middleware=stack).invoke(
            turn(scene, "unsure? " + BIG)
        )
        assert out["speceyes"]["route"] == "rejected-agentic", order
        assert small.calls == 1, order  # one draft
        judged = [m for m in large.received if "yes or no" in question_of(m)]
        assert len(judged) == 1, order  # one judge call
        assert out["messages"][-1].content == "<answer>red</answer>"

    routes = []
    for order in ("fallback outside", "fallback inside"):
        dead = large_model(fail_judge=True)
        dead.respond = lambda msgs: (_ for _ in ()).throw(RuntimeError("the primary is down"))
        backup, small = large_model(), small_model()
        fallback, speceyes = ModelFallbackMiddleware(backup), SpecEyesMiddleware(small)
        stack = [fallback, speceyes] if order == "fallback outside" else [speceyes, fallback]
        out = create_agent(dead, [make_zoom_tool()], middleware=stack).invoke(turn(scene, BIG))
        routes.append(out["speceyes"]["route"])
        assert "primary is down" in out["speceyes"]["error"], order
        assert small.calls == 0 and out["messages"][-1].content == "<answer>red</answer>", order
    assert routes == ["judged-agentic", "judged-agentic"]


def test_an_accepted_draft_streams_as_token_chunks(scene):
    """In ``stream_mode="messages"`` an accepted draft arrives as the agent's replies do:
    chunks of its tokens, with the id of the reply the state keeps, and nothing of the
    judge's or the draft's own calls (issue 55). Sync and async alike."""
    from speceyes_graph.models import fake_logprobs

    tokens = ["the", " blue", " one"]
    small = ScriptedChatModel(
        respond=lambda msgs: AIMessage(
            content="".join(tokens), response_metadata={"logprobs": fake_logprobs(tokens, [9.0] * 3)}
        )
    )
    agent = create_agent(large_model(), [make_zoom_tool()], middleware=[SpecEyesMiddleware(small)])

    async def astream():
        return [c async for c, _ in agent.astream(turn(scene, BIG), stream_mode="messages")]

    for streamed in (
        [c for c, _ in agent.stream(turn(scene, BIG), stream_mode="messages")],
        asyncio.run(astream()),
    ):
        assert [c.content for c in streamed] == tokens
        assert len({c.id for c in streamed}) == 1
        assert streamed[-1].response_metadata["speceyes"]["route"] == "speculative"
    final = agent.invoke(turn(scene, BIG))["messages"][-1]
    assert final.content == "the blue one" and final.id.startswith("speceyes-")


def test_a_tool_selector_inside_it_gets_what_its_model_can_read_and_skips_accepted_turns(scene):
    """LangChain's LLMToolSelectorMiddleware placed after SpecEyes (inside it), as the docs'
    table says: it never runs on an accepted turn, and its own model (here one that does
    not read the image store, as a served one) is sent the image as base64, not a
    ``blob://`` key."""
    from langchain.agents.middleware import LLMToolSelectorMiddleware

    seen = []

    def pick(msgs):
        seen.append(json.dumps([m.content for m in msgs]))
        call = {"name": "ToolSelectionResponse", "args": {"tools": ["zoom"]}, "id": "pick-1"}
        return AIMessage(content="", tool_calls=[call])

    selector = LLMToolSelectorMiddleware(model=ScriptedChatModel(respond=pick), max_tools=1)
    agent = create_agent(
        large_model(), [make_zoom_tool(), make_crop_tool()],
        middleware=[SpecEyesMiddleware(small_model()), selector],
    )  # fmt: skip
    assert agent.invoke(turn(scene, BIG))["speceyes"]["route"] == "speculative"
    assert seen == []  # not run on an accepted turn
    out = agent.invoke(turn(scene, TINY))
    assert out["messages"][-1].content == "<answer>red</answer>" and seen
    assert all("blob://" not in s for s in seen) and "iVBORw0KGgo" in seen[0]
    # its "last user message" is the question on every step, the one after the zoom too
    # (the tools' image turn is a user-role ChatMessage, not a HumanMessage)
    assert len(seen) == 2 and all(TINY in s and "returned by the tools" not in s for s in seen)


def test_the_tools_image_turn_is_a_user_turn_on_the_wire(scene):
    """After a tool's picture the agent's model is sent it in a user-role turn: our model
    takes it as one, and langchain-openai's payload says ``"role": "user"`` with the image
    as base64 (what an OpenAI-compatible server is sent; it rejects images in tool turns)."""
    from langchain_openai import ChatOpenAI

    from speceyes_graph.messages import wire_messages

    large = large_model()
    middleware = SpecEyesMiddleware(small_model())
    agent = create_agent(large, [make_zoom_tool()], middleware=[middleware])
    out = agent.invoke(turn(scene, TINY))
    after_zoom = large.received[-1]
    assert after_zoom[-1].type == "chat" and after_zoom[-1].role == "user"
    assert any(b.get("type") == "image" for b in after_zoom[-1].content)
    served = ChatOpenAI(model="m", api_key="k", base_url="http://127.0.0.1:9/v1")
    payload = served._get_request_payload(wire_messages(out["messages"], served, middleware.store))
    roles = [m["role"] for m in payload["messages"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    image_turn = payload["messages"][3]["content"]
    assert image_turn[0]["text"].startswith("Images returned by the tools")
    assert image_turn[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")


def test_a_tool_selector_outside_it_reads_the_store_through_readable(scene):
    """Placed before SpecEyes (outside it), a middleware sees the state's ``blob://`` keys;
    its model wrapped by ``readable`` is sent the pixels instead, and still answers the
    selector's structured-output call."""
    from langchain.agents.middleware import LLMToolSelectorMiddleware

    def selector_of(speceyes, wrap):
        seen = []

        def pick(msgs):
            seen.append(json.dumps([m.content for m in msgs]))
            call = {"name": "ToolSelectionResponse", "args": {"tools": ["zoom"]}, "id": "p-1"}
            return AIMessage(content="", tool_calls=[call])

        model = ScriptedChatModel(respond=pick)
        return LLMToolSelectorMiddleware(model=speceyes.readable(model) if wrap else model), seen

    for wrap in (False, True):
        speceyes = SpecEyesMiddleware(small_model())
        selector, seen = selector_of(speceyes, wrap)
        agent = create_agent(
            large_model(), [make_zoom_tool(), make_crop_tool()], middleware=[selector, speceyes]
        )
        out = agent.invoke(turn(scene, TINY))
        assert out["messages"][-1].content == "<answer>red</answer>" and len(seen) == 2
        if wrap:
            assert all("blob://" not in s and "iVBORw0KGgo" in s for s in seen)
        else:  # what it would send a server without the wrapper
            assert all("blob://" in s for s in seen)


def test_a_readable_model_is_the_wrapped_model_on_every_path(scene):
    """``readable(model)`` by invoke, ainvoke, stream and astream: the wrapped model is
    sent pixels for the state's keys, and its own run is the only one a tracer sees."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Starts(BaseCallbackHandler):
        def __init__(self):
            self.models = []

        def on_chat_model_start(self, serialized, messages, **kwargs):
            self.models.append(kwargs.get("invocation_params", {}).get("_type"))

    speceyes = SpecEyesMiddleware(small_model())
    keyed = speceyes.before_agent(turn(scene, BIG), None)["messages"]
    assert "blob://" in json.dumps([m.content for m in keyed])
    inner = ScriptedChatModel(respond=lambda msgs: "seen")
    model, starts = speceyes.readable(inner), Starts()
    config = {"callbacks": [starts]}
    assert model.invoke(keyed, config).content == "seen"
    assert asyncio.run(model.ainvoke(keyed, config)).content == "seen"
    assert "".join(c.content for c in model.stream(keyed, config)) == "seen"

    async def astreamed():
        return "".join([c.content async for c in model.astream(keyed, config)])

    assert asyncio.run(astreamed()) == "seen"
    assert len(inner.received) == 4 and starts.models == ["scripted"] * 4
    for received in inner.received:
        text = json.dumps([m.content for m in received])
        assert "blob://" not in text and "iVBORw0KGgo" in text
