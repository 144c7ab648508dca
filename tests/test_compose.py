"""SpecEyes inside other things: a chat front, a tool for other agents, clean streams."""

import base64
import json

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_chat_graph, create_speceyes_graph, speceyes_tool
from speceyes_graph.models import ScriptedChatModel


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
    assert [m.type for m in first["messages"]] == ["human", "ai"]
    assert first["messages"][-1].content == "B" and first["route"] == "judged-agentic"
    assert first["messages"][-1].response_metadata["speceyes"]["route"] == "judged-agentic"
    # the pasted image was moved into the image store: the thread holds a reference
    stored = g.get_state(cfg).values["messages"][0].content
    assert stored[1]["url"].startswith("blob://") and "base64" not in json.dumps(stored)
    # a follow-up without an image asks about the latest image of the conversation
    second = g.invoke({"messages": [HumanMessage(content="And the big one?")]}, cfg)
    assert [m.type for m in second["messages"]] == ["human", "ai", "human", "ai"]
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
    assert out["error"].startswith("input: ") and "could not answer" in out["messages"][-1].content
    empty = g.invoke({"messages": [AIMessage(content="hello")]})
    assert "Ask a question" in empty["messages"][-1].content


def test_messages_stream_carries_only_the_answer(scene):
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
    assert chunks == [("ai", "B", "answer")]  # no judge "yes", no draft, no agent turns, no pixels
    # on the plain graph, the judge's and the speculator's calls are not streamed either
    plain = create_speceyes_graph(**models()).compile()
    msgs = [
        m for m, _ in plain.stream({"question": "big?", "images": [scene]}, stream_mode="messages")
    ]
    assert msgs == []


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


def test_standard_xray_drawing_works(scene):
    for g in (create_speceyes_graph(**models()), create_speceyes_chat_graph(**models())):
        drawing = g.compile().get_graph(xray=True).draw_ascii()
        for node in ("intake", "judge", "speculate", "gate", "agent", "tools", "correct", "finish"):
            assert node in drawing
