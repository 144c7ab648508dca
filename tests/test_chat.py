"""The chat front as a person in a stock chat UI meets it: every image shape a client sends
is read (or the turn says why not), the reply is an answer, the person's images stay visible
as thumbnails, the agent's zooms show as tool calls, and a failed turn leaves a reply.

Scripted models, in process; tests/test_chat_ui.py drives the same through ``langgraph dev``
with the real JS SDK and a real browser."""

from __future__ import annotations

import base64
import json

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from helpers import deepeyes_agent, judge, speculator
from speceyes_graph import create_speceyes_chat_graph
from speceyes_graph._compat import PUSHED_MESSAGES_KEEP_THE_GRAPH
from speceyes_graph.integrations.chat import chat_reply
from speceyes_graph.models import ScriptedChatModel
from speceyes_tools.blobs import blob_key

TINY = "What is the tiny thing?"  # the scripted judge sends it to the agent, which zooms


def shapes(png: bytes) -> dict[str, dict]:
    """One image as each kind of chat client sends it."""
    b64 = base64.b64encode(png).decode()
    url = "data:image/png;base64," + b64
    return {
        "langchain-js-v1 (agent-chat-ui)": {
            "type": "image", "mimeType": "image/png", "data": b64, "metadata": {"name": "scene.png"}
        },
        "langchain-js-v1 url": {"type": "image", "url": url},
        "langchain-py-v1 base64": {"type": "image", "base64": b64, "mime_type": "image/png"},
        "langchain-py-v1 url": {"type": "image", "url": url, "mime_type": "image/png"},
        "langchain-py-v0": {
            "type": "image", "source_type": "base64", "mime_type": "image/png", "data": b64
        },
        "openai string": {"type": "image_url", "image_url": url},
        "openai object": {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        "anthropic": {
            "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}
        },
        "file js": {
            "type": "file", "mimeType": "image/png", "data": b64,
            "metadata": {"filename": "scene.png"},
        },
        "file py": {"type": "file", "base64": b64, "mime_type": "image/png"},
        "file openai": {"type": "file", "file": {"file_data": url, "filename": "scene.png"}},
    }  # fmt: skip


def refusing(name: str) -> ScriptedChatModel:
    def respond(messages):
        raise AssertionError(f"the {name} was called on a turn that cannot run")

    return ScriptedChatModel(respond=respond)


def chat(**models):
    graph = create_speceyes_chat_graph(
        **{
            "judge": judge(lambda q: "no" if "big" in q else "yes"),
            "speculator": speculator("A", 9.0),
            "agent": deepeyes_agent(answer="B"),
            "image_url": "/speceyes/images/{digest}?thread_id={thread_id}",
            **models,
        }
    )
    return graph.compile(checkpointer=InMemorySaver())


def turn(graph, thread: str, *content) -> dict:
    blocks = [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    return graph.invoke(
        {"messages": [{"role": "user", "content": blocks}]},
        {"configurable": {"thread_id": thread}},
    )


def checkpoints_json(graph, thread: str) -> str:
    history = list(graph.get_state_history({"configurable": {"thread_id": thread}}))
    return json.dumps([h.values for h in history], default=str)


@pytest.mark.parametrize("shape", list(shapes(b"")))
def test_every_image_shape_a_chat_client_sends_is_read(scene, shape):
    """Each shape: the agent zooms into the person's image (its bytes' key), the thread keeps
    a thumbnail of it naming that key and where the server serves it, and no checkpoint
    holds the image. (Before: the JS, Anthropic and file shapes were ignored, and the turn
    ran blind.)"""
    png = open(scene, "rb").read()
    graph = chat()
    out = turn(graph, "t", TINY, shapes(png)[shape])
    assert out["error"] is None and out["route"] == "judged-agentic"
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][-1].content == "B"
    shown = out["messages"][0].content[1]
    assert shown["type"] == "image" and shown["mimeType"] == "image/jpeg"
    assert shown["metadata"]["speceyes_image"] == blob_key(png)
    assert shown["metadata"]["url"] == f"/speceyes/images/{blob_key(png)[7:]}?thread_id=t"
    assert len(shown["data"]) < 8000 and base64.b64decode(shown["data"])[:3] == b"\xff\xd8\xff"
    if "name" in json.dumps(shapes(png)[shape]):
        assert shown["metadata"]["name"] == "scene.png"
    assert base64.b64encode(png).decode()[:200] not in checkpoints_json(graph, "t")


def test_the_agents_zoom_shows_as_a_tool_call_with_its_crop(scene):
    out = turn(chat(), "t", TINY, shapes(open(scene, "rb").read())["openai object"])
    call, result, answer = out["messages"][1:]
    assert call.tool_calls[0]["name"] == "image_zoom_in_tool" and "<" not in call.content
    assert result.tool_call_id == call.tool_calls[0]["id"] and "region" in result.content
    crop = result.artifact["crop"]
    assert crop["mimeType"] == "image/jpeg" and crop["metadata"]["speceyes_image"]
    assert answer.response_metadata["speceyes"]["route"] == "judged-agentic"


def test_a_speculative_answer_says_it_passed_the_gate(scene):
    out = turn(chat(), "t", "big?", shapes(open(scene, "rb").read())["openai string"])
    assert [m.type for m in out["messages"]] == ["human", "ai"]
    meta = out["messages"][-1].response_metadata["speceyes"]
    assert meta["route"] == "speculative" and meta["score"] > 0.98


def no_model():
    return {"judge": refusing("judge"), "speculator": refusing("speculator"), "agent": refusing("agent")}  # fmt: skip


@pytest.mark.parametrize(
    "content, says",
    [
        (["What is in the picture?"], ["attach an image"]),
        (
            [
                "Summarise this",
                {
                    "type": "file",
                    "mimeType": "application/pdf",
                    "data": base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode(),
                    "metadata": {"filename": "report.pdf"},
                },
            ],
            ["report.pdf", "not an image"],
        ),
        (
            [
                "What is it?",
                {
                    "type": "image",
                    "mimeType": "image/png",
                    "data": base64.b64encode(b"not an image").decode(),
                    "metadata": {"name": "broken.png"},
                },
            ],
            ["broken.png", "could not read"],
        ),
        (
            ["What is it?", {"type": "image", "base64": "%%% not base64", "mime_type": "image/png"}],
            ["not base64"],
        ),
        (["What is it?", {"type": "image", "file_id": "file-abc"}], ["could not read"]),
    ],
)
def test_a_turn_that_cannot_run_says_why_without_a_model_call(content, says):
    graph = chat(**no_model())
    out = turn(graph, "t", *content)
    reply = out["messages"][-1]
    assert reply.type == "ai" and all(s in reply.content for s in says), reply.content
    assert out["error"] == reply.content and out.get("route") is None
    assert "blob://" not in reply.content  # the person's file is named, not the store's key
    assert "JVBERi0" not in checkpoints_json(graph, "t")  # nor is the PDF kept


def test_a_failed_turn_names_the_file_and_the_thread_goes_on(scene):
    def agent(messages):
        raise RuntimeError("the agent's server is down")

    png = open(scene, "rb").read()
    graph = chat(agent=ScriptedChatModel(respond=agent), on_error="raise")
    block = shapes(png)["langchain-js-v1 (agent-chat-ui)"]
    out = turn(graph, "t", TINY, block)
    assert out["messages"][-1].type == "ai" and "scene.png" in out["messages"][-1].content
    assert "server is down" in out["error"]
    # the next turn on the same thread answers
    after = turn(graph, "t", "And the big one?")
    assert after["error"] is None and after["messages"][-1].content == "A"


@pytest.mark.parametrize(
    "answer, options, reply",
    [
        ("<answer>red", None, "red"),
        ("<think>hmm</think>\n<answer>red</answer>", None, "red"),
        ("<answer><answer><answer>", None, None),
        ('<think>x</think><tool_call>{"name": "zoom"', None, None),
        ("B", ["red", "green"], "B. green"),
        ("(B)", ["red", "green"], "B. green"),
        ("green", ["red", "green"], "green"),
        ("<answer>purple", ["red", "green"], None),
        ("<answer><answer>", ["red", "green"], None),
    ],
)
def test_the_reply_is_an_answer_never_protocol_text(answer, options, reply):
    assert chat_reply(answer, options) == reply


def test_an_answer_matching_no_option_says_so_and_keeps_the_models_text(scene):
    graph = chat(agent=deepeyes_agent(answer="<answer>purple"))
    image = shapes(open(scene, "rb").read())["openai string"]
    out = turn(graph, "t", TINY + "\nOptions: red; green", image)
    text = out["messages"][-1].content
    assert text == "I could not tell which of the options is right."
    assert "purple" in out["messages"][-1].response_metadata["speceyes"]["answer"]


def test_a_pasted_photo_leaves_a_thumbnail_of_a_few_kb_in_the_thread(tmp_path):
    """A noisy 1600x1200 photo (5.8 MB as PNG): the thread's whole history, over two turns,
    stays a few KB per image. (Before: the base64 stayed in every checkpoint.)"""
    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 256, (1200, 1600, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "photo.png")
    png = (tmp_path / "photo.png").read_bytes()
    graph = chat()
    turn(graph, "t", TINY, shapes(png)["langchain-js-v1 (agent-chat-ui)"])
    turn(graph, "t", "And the big one?")
    assert len(checkpoints_json(graph, "t")) < 60_000 and len(png) > 5_000_000


async def test_each_zoom_reaches_the_messages_stream_as_it_happens(scene):
    """The tool call and its result are on the chat's messages stream while the agent is
    still working (as a server streams: ``astream``): the consumer sees the zoom's result
    before the agent's next turn has answered. Before, the steps came only with the answer,
    at the end of the turn."""
    calls = []
    zoom = deepeyes_agent(answer="B")

    def agent(messages):
        calls.append(len(messages))
        return zoom.respond(messages)

    graph = chat(agent=ScriptedChatModel(respond=agent, delay_s=0.5))
    png = open(scene, "rb").read()
    message = {"role": "user", "content": [{"type": "text", "text": TINY}, shapes(png)["openai string"]]}  # fmt: skip
    seen = []  # (message type, agent turns answered by then)
    async for chunk, _ in graph.astream(
        {"messages": [message]}, {"configurable": {"thread_id": "t"}}, stream_mode="messages"
    ):
        seen.append((chunk.type, len(calls)))
    assert [kind for kind, _ in seen] == ["ai", "tool", "ai"]  # each once
    # the zoom's result while the agent's next turn runs; on a LangGraph whose push_message
    # streams a node's message as a subgraph's (before 1.2.19), with the answer
    assert seen[1] == ("tool", 1 if PUSHED_MESSAGES_KEEP_THE_GRAPH else 2)
    state = (await graph.aget_state({"configurable": {"thread_id": "t"}})).values
    assert [m.type for m in state["messages"]] == ["human", "ai", "tool", "ai"]


def test_a_model_is_sent_the_stored_image_never_the_thumbnail(scene):
    """What a chat keeps for the person (a thumbnail, a file it did not read) reaches any
    model as what it stands for: the stored image (as a reference or its bytes), or a note."""
    from types import SimpleNamespace

    from langchain_core.messages import HumanMessage

    from speceyes_graph.messages import for_model
    from speceyes_tools.images import ImageStore

    store = ImageStore()
    png = open(scene, "rb").read()
    key = store.put(png)
    kept = HumanMessage(
        content=[
            {"type": "image", "mimeType": "image/jpeg", "data": "/9j/AAAA",
             "metadata": {"name": "scene.png", "speceyes_image": key}},
            {"type": "file", "mimeType": "application/pdf",
             "metadata": {"filename": "report.pdf", "speceyes_not_read": "not an image"}},
        ]
    )  # fmt: skip
    served = for_model([kept], speculator(), store)[0].content  # a model without refs
    assert served[0]["base64"] == base64.b64encode(png).decode()
    assert served[1] == {"type": "text", "text": "[report.pdf: not an image, not read]"}
    local = for_model([kept], SimpleNamespace(accepts_image_refs=True), store)  # reads the store
    assert local[0].content[0]["url"] == key


def test_an_image_by_url_is_fetched_once_and_shown_or_refused_by_the_policy(scene, image_server):
    """A URL image: fetched under the store's policy into the store, shown as a thumbnail
    like a pasted one; a URL the policy refuses gets a reply, with no model call."""
    from speceyes_tools.images import ImagePolicy, ImageStore

    url = image_server.url("/image.png")  # the scene, over loopback HTTP
    graph = chat(store=ImageStore())  # the library default: fetches from this machine
    out = turn(graph, "t", TINY, {"type": "image", "url": url})
    assert out["error"] is None and out["messages"][-1].content == "B"
    assert out["messages"][0].content[1]["metadata"]["speceyes_image"] == blob_key(open(scene, "rb").read())
    strict = chat(store=ImageStore(policy=ImagePolicy.strict()), **no_model())
    refused = turn(strict, "t", TINY, {"type": "image_url", "image_url": {"url": url}})
    assert "could not read" in refused["messages"][-1].content and refused["error"]
