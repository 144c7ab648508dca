"""SpecEyes inside other things: a chat front, a tool for other agents, clean streams."""

import asyncio
import base64
import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_chat_graph, create_speceyes_graph, speceyes_tool
from speceyes_graph.integrations.turns import split_options
from speceyes_graph.models import ScriptedChatModel, fake_logprobs
from speceyes_graph.protocol import message_text


def models(**kw):
    return {
        "judge": judge(lambda q: "no" if "big" in q else "yes"),
        "speculator": speculator("A", 9.0),
        "agent": deepeyes_agent(answer="B"),
        **kw,
    }


def pasted(path):
    return {
        "type": "image_url",
        "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()
        },
    }


def test_chat_graph_answers_and_keeps_no_pixels(scene):
    g = create_speceyes_chat_graph(**models()).compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "chat"}}
    first = g.invoke(
        {
            "messages": [
                HumanMessage(
                    content=[{"type": "text", "text": "What is the tiny thing?"}, pasted(scene)]
                )
            ]
        },
        cfg,
    )
    # the agent's zoom shows as a tool call and its result, then the answer
    assert [m.type for m in first["messages"]] == ["human", "ai", "tool", "ai"]
    assert first["messages"][1].tool_calls[0]["name"] == "image_zoom_in_tool"
    assert first["messages"][-1].content == "B" and first["route"] == "judged-agentic"
    assert first["messages"][-1].response_metadata["speceyes"]["route"] == "judged-agentic"
    # the pasted image was moved into the image store: the thread holds a thumbnail that
    # names the stored image, not the image
    stored = g.get_state(cfg).values["messages"][0].content
    assert stored[1]["metadata"]["speceyes_image"].startswith("blob://")
    assert len(stored[1]["data"]) < 8000 and "base64" not in json.dumps(stored)
    # a follow-up without an image asks about the latest image of the conversation
    second = g.invoke({"messages": [HumanMessage(content="And the big one?")]}, cfg)
    assert [m.type for m in second["messages"]] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert second["messages"][-1].content == "A" and second["route"] == "speculative"
    # per-run context reaches the SpecEyes graph inside
    strict = g.invoke(
        {"messages": [HumanMessage(content="The big one again?")]}, cfg, context={"tau": 0.99999}
    )
    assert strict["route"] == "rejected-agentic"


def test_chat_graph_reports_failures_as_answers(scene):
    g = create_speceyes_chat_graph(**models()).compile()
    out = g.invoke(
        {
            "messages": [
                HumanMessage(
                    content=[
                        {"type": "text", "text": "big?"},
                        {"type": "image_url", "image_url": {"url": "/no/such.png"}},
                    ]
                )
            ]
        }
    )
    # an image the store cannot read is answered at once, naming it: no model call
    assert "could not read" in out["messages"][-1].content and "/no/such.png" in out["error"]
    empty = g.invoke({"messages": [AIMessage(content="hello")]})
    assert "attach an image" in empty["messages"][-1].content


def test_messages_stream_carries_the_steps_and_the_answer(scene):
    g = create_speceyes_chat_graph(**models()).compile()
    chunks = [
        (msg.type, msg.content, meta["langgraph_node"])
        for msg, meta in g.stream(
            {
                "messages": [
                    HumanMessage(content=[{"type": "text", "text": "tiny?"}, pasted(scene)])
                ]
            },
            stream_mode="messages",
        )
    ]
    # the zoom as a chat shows it, then the answer: no judge "yes", no draft, no raw agent
    # turns (protocol text), no pixels
    assert [(t, node) for t, _, node in chunks] == [("ai", "answer"), ("tool", "answer")] + [
        ("ai", "answer")
    ]
    assert chunks[-1][1] == "B" and "<" not in json.dumps([c[1] for c in chunks])
    # on the plain graph, the judge's and the speculator's calls are not streamed either
    plain = create_speceyes_graph(**models()).compile()
    msgs = [
        m for m, _ in plain.stream({"question": "big?", "images": [scene]}, stream_mode="messages")
    ]
    assert msgs == []


@pytest.mark.parametrize(
    "text, question, options",
    [
        ("What colour is it?", "What colour is it?", None),
        ("What colour?\nOptions: red; green; blue", "What colour?", ["red", "green", "blue"]),
        ("What colour?\noptions: red | light green", "What colour?", ["red", "light green"]),
        ("What colour?\nOptions: red, green", "What colour?", ["red", "green"]),
        ("What colour?\nOptions: (A) red (B) dark green", "What colour?", ["red", "dark green"]),
        ("What colour?\nOptions: A. red B. green", "What colour?", ["red", "green"]),
        # the models' own prompt layout reads back (format_question, compact and published)
        ("Question: What?\nOptions: \nA. red\nB. a big one\n", "What?", ["red", "a big one"]),
        ("Question: What?\n        Options: \nA. red\nB. blue\n\n        ", "What?", ["red", "blue"]),
        ("question:Why is it?", "Why is it?", None),
        ("Which?\n  Options:\n(A) yes, it is\n(B) no\n\n", "Which?", ["yes, it is", "no"]),
        ("Which?\nOptions:\n- first\nsecond", "Which?", ["- first", "second"]),
        ("Which?\nOptions:", "Which?", None),  # an empty list: no options
        # labels out of order are text, not labels
        ("Is it B. or C.?\nOptions: B. yes C. no", "Is it B. or C.?", ["B. yes C. no"]),
    ],
)
def test_split_options(text, question, options):
    assert split_options(text) == (question, options)


def test_chat_graph_takes_options_from_an_options_line(scene):
    seen = []

    def respond(msgs):
        seen.append(message_text(msgs[-1]))
        return AIMessage(content="B", response_metadata={"logprobs": fake_logprobs(["B"], [9.0])})

    g = create_speceyes_chat_graph(**models(speculator=ScriptedChatModel(respond=respond)))
    text = "What is the big colour?\nOptions: red; green; blue"
    out = g.compile().invoke(
        {"messages": [HumanMessage(content=[{"type": "text", "text": text}, pasted(scene)])]}
    )
    assert out["route"] == "speculative" and out["messages"][-1].content == "B. green"
    assert seen[0].startswith("Question: What is the big colour?\n")
    assert "\nA. red\nB. green\nC. blue\n" in seen[0]
    assert "Options: red; green" not in seen[0]  # the line became the graph's options


def test_messages_stream_with_subgraphs_carries_only_the_chats_messages(scene):
    """Studio and chat UIs may stream with subgraphs on: still only the answer (the agent's
    turns and tool results stay internal), while updates still show the inner steps."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Runs(BaseCallbackHandler):
        def __init__(self):
            self.parent, self.models = {}, []

        def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, **kw):
            self.parent[run_id] = parent_run_id

        def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, **kw):
            self.parent[run_id] = parent_run_id
            self.models.append(run_id)

        def root(self, run_id):
            while self.parent.get(run_id) is not None:
                run_id = self.parent[run_id]
            return run_id

    g = create_speceyes_chat_graph(**models()).compile()
    message = HumanMessage(content=[{"type": "text", "text": "tiny?"}, pasted(scene)])
    runs = Runs()
    chunks = list(
        g.stream(
            {"messages": [message]},
            {"callbacks": [runs]},
            stream_mode=["messages", "updates"],
            subgraphs=True,
        )
    )
    messages = [(ns, c[0].type, c[0].content) for ns, mode, c in chunks if mode == "messages"]
    assert [(ns, t) for ns, t, _ in messages] == [((), "ai"), ((), "tool"), ((), "ai")]
    assert messages[-1][2] == "B"  # the zoom as the chat shows it, then the answer
    inner = {next(iter(c)) for ns, mode, c in chunks if mode == "updates" and ns}
    assert {"judge", "agent", "tools"} <= inner  # the inner run is still visible as updates
    # callbacks and tracing still see every model call, inside one run tree
    assert len(runs.models) == 3  # the judge and two agent turns
    roots = [r for r, parent in runs.parent.items() if parent is None]
    assert len(roots) == 1 and {runs.root(r) for r in runs.models} == set(roots)


def test_speceyes_tool_gives_a_compact_result(scene):
    tool = speceyes_tool(create_speceyes_graph(**models()))
    assert set(tool.args) == {"question", "images", "options"}  # no internal fields required
    out = json.loads(tool.invoke({"question": "big?", "images": [scene]}))
    assert (
        out == {"answer": "A", "route": "speculative", "score": out["score"]}
        and out["score"] > 0.98
    )
    failed = tool.invoke({"question": "big?", "images": ["/no/such.png"]})
    assert failed.startswith("Error: input: ImageLoadError") and len(failed) < 300


def test_speceyes_tool_inside_langchain_create_agent(scene):
    from langchain.agents import create_agent

    def supervisor(messages):
        last = messages[-1]
        if last.type == "tool":
            answer = json.loads(last.content)["answer"]
            return AIMessage(content=f"The answer is {answer}.")
        return AIMessage(
            content="",
            tool_calls=[
                {
                    "name": "ask_about_images",
                    "args": {"question": "tiny?", "images": [scene]},
                    "id": "c1",
                }
            ],
        )

    agent = create_agent(
        model=ScriptedChatModel(respond=supervisor),
        tools=[speceyes_tool(create_speceyes_graph(**models()))],
    )
    out = agent.invoke({"messages": [HumanMessage(content="What is in the picture?")]})
    tool_message = next(m for m in out["messages"] if m.type == "tool")
    assert json.loads(tool_message.content)["route"] == "judged-agentic"
    assert len(tool_message.content) < 200  # compact: no transcripts, no pixels
    assert out["messages"][-1].content == "The answer is B."


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_tools_inner_run_stays_out_of_the_messages_stream(scene, asynchronous):
    """An agent using the tool, streamed with ``messages`` and ``subgraphs=True``: only the
    agent's own messages (its tool call, the tool's compact result, its answer), never the
    inner graph's judge prompt, agent turns or tool results; ``updates`` still show them."""
    from langchain.agents import create_agent

    def supervisor(messages):
        if messages[-1].type == "tool":
            return AIMessage(content="Done: " + json.loads(messages[-1].content)["answer"])
        call = {"name": "ask_about_images", "args": {"question": "tiny?", "images": [scene]}}
        return AIMessage(content="", tool_calls=[{**call, "id": "c1"}])

    agent = create_agent(
        model=ScriptedChatModel(respond=supervisor),
        tools=[speceyes_tool(create_speceyes_graph(**models()))],
    )
    question = {"messages": [HumanMessage(content="What is in the picture?")]}
    options = {"stream_mode": ["messages", "updates"], "subgraphs": True}
    if asynchronous:

        async def collect():
            return [c async for c in agent.astream(question, **options)]

        chunks = asyncio.run(collect())
    else:
        chunks = list(agent.stream(question, **options))
    messages = [(ns, c[0].type) for ns, mode, c in chunks if mode == "messages"]
    assert all(ns == () for ns, _ in messages), messages
    assert [t for _, t in messages] == ["ai", "tool", "ai"]
    inner = {next(iter(c)) for ns, mode, c in chunks if mode == "updates" and ns}
    assert {"judge", "agent", "tools"} <= inner


def test_standard_xray_drawing_works(scene):
    for g in (create_speceyes_graph(**models()), create_speceyes_chat_graph(**models())):
        drawing = g.compile().get_graph(xray=True).draw_ascii()
        for node in ("intake", "judge", "speculate", "gate", "agent", "tools", "correct", "finish"):
            assert node in drawing
