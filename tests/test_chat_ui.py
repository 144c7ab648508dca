"""The chat graph ``speceyes_chat`` under ``langgraph dev``, driven as chat UIs drive it.

Two real clients (``bash scripts/setup-js.sh`` installs them in ``tests/js``):

- ``@langchain/langgraph-sdk``'s ``Client`` under Node (``tests/js/sdk_turns.mjs``), streaming
  each turn with the modes ``useStream`` asks for, subgraphs included, the human message's
  image in every block shape LangChain (JS v1, Python v1 and v0), OpenAI and Anthropic
  clients send;
- a page on the SDK's ``useStream`` React hook that renders as LangChain's agent-chat-ui does
  (``tests/js/page``), in headless Chromium through playwright-core
  (``tests/js/browser_turn.mjs``; marked ``browser``).

What a chat UI relies on: each turn is answered as the plain graph answers the same demo
query; the thread keeps a small thumbnail of each image (``mimeType``/``data``, what
agent-chat-ui renders) and a link to the full image, never the image itself; the agent's
tool steps are messages (an AI message with ``tool_calls``, then ``tool`` messages) before
the plain-text answer, whose ``response_metadata.speceyes`` holds the route and score; a turn
without an image, or with an unreadable one, gets a reply that says so, and the thread goes
on. Deselect with ``-m "not server"`` (``-m "not browser"`` for the browser test alone).
"""

from __future__ import annotations

import base64
import functools
import http.server
import io
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from test_server import LOGS, dev_server, reference_scenes

from speceyes_graph.models.servers import free_port

# one worker under -n (--dist loadgroup): the module's server, scenes and Node runs, once
pytestmark = [pytest.mark.server, pytest.mark.xdist_group("chat_ui")]

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "tests" / "js"
CHROMIUM = os.environ.get("SPECEYES_CHROMIUM", "/usr/bin/chromium")
SETUP = "run `bash scripts/setup-js.sh` first"
THUMBNAIL_MAX_BYTES = 10_000  # "at most ~8 KB", with room for rounding
LONGEST_STATE_STRING = 12_000
HISTORY_MAX_BYTES = 200_000  # one turn's last 10 checkpoints, as getHistory returns them


# --- the block shapes a chat UI or an SDK sends an image in ---


def data_url(b64: str, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64}"


# name -> (block of base64 PNG data, the file name the block carries or None)
SHAPES = {
    # LangChain JS v1 (agent-chat-ui's fileToContentBlock)
    "js-v1-image-data": (
        lambda b: {
            "type": "image",
            "mimeType": "image/png",
            "data": b,
            "metadata": {"name": "scene.png"},
        },
        "scene.png",
    ),  # fmt: skip
    # LangChain JS v1 and Python v1 alike
    "v1-image-url": (lambda b: {"type": "image", "url": data_url(b)}, None),
    # LangChain Python v1
    "py-v1-image-base64": (
        lambda b: {"type": "image", "base64": b, "mime_type": "image/png"},
        None,
    ),
    # LangChain Python v0
    "py-v0-image-source-type": (
        lambda b: {"type": "image", "source_type": "base64", "mime_type": "image/png", "data": b},
        None,
    ),
    # OpenAI chat completions
    "openai-image-url-string": (lambda b: {"type": "image_url", "image_url": data_url(b)}, None),
    "openai-image-url-dict": (
        lambda b: {"type": "image_url", "image_url": {"url": data_url(b), "detail": "high"}},
        None,
    ),
    # Anthropic messages
    "anthropic-image-source": (
        lambda b: {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": b},
        },
        None,
    ),  # fmt: skip
    # file blocks that hold an image: LangChain JS v1, LangChain Python v1, OpenAI
    "js-v1-file-image": (
        lambda b: {
            "type": "file",
            "mimeType": "image/png",
            "data": b,
            "metadata": {"filename": "scene.png"},
        },
        "scene.png",
    ),  # fmt: skip
    "py-v1-file-image": (
        lambda b: {"type": "file", "base64": b, "mime_type": "image/png"},
        None,
    ),
    "openai-file-image": (
        lambda b: {"type": "file", "file": {"file_data": data_url(b), "filename": "scene.png"}},
        "scene.png",
    ),
}


def question_text(inputs) -> str:
    """A demo query's text as a chat user types it (``test_server.chat_message``)."""
    return inputs["question"] + "\nOptions: " + "; ".join(inputs["options"])


def png_b64(inputs) -> str:
    return inputs["images"][0].split(",", 1)[1]


def turn(inputs, shape: str = "js-v1-image-data") -> list[dict]:
    """One human turn's content: the question's text block, then the image (as
    agent-chat-ui orders them)."""
    return [{"type": "text", "text": question_text(inputs)}, SHAPES[shape][0](png_b64(inputs))]


def tiny_pdf() -> bytes:
    """A valid one-page PDF (a correct cross-reference table) of a few hundred bytes."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length 44 >>\nstream\nBT /F1 18 Tf 20 40 Td (Quarterly) Tj ET\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def judged_agentic(scenes):
    return next((i, e) for i, e in scenes if e["route"] == "judged-agentic")


# --- the server and the Node client ---


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Demo scenes and what the plain graph answers in this process (as test_server's)."""
    return reference_scenes(tmp_path_factory.mktemp("scenes"))


FIRST_ANSWER = ROOT / "build" / "figures" / "chat-first-answer.txt"  # conftest prints it


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """``langgraph dev`` with no SPECEYES_* settings: the shipped demo checkpoints. Measured
    as it comes up: the seconds to ``/ok`` and to the first reply (a turn without an image:
    the graph and its models are built for it, then it is answered without a model call),
    written for the CI log (docs/deployment.md, "Time to the first answer")."""
    from langgraph_sdk import get_sync_client

    t0 = time.time()
    for url in dev_server(tmp_path_factory):
        ready = time.time() - t0
        client = get_sync_client(url=url)
        thread = client.threads.create()["thread_id"]
        t1 = time.time()
        client.runs.wait(thread, "speceyes_chat", input={"messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        first = time.time() - t1
        t2 = time.time()
        client.runs.wait(thread, "speceyes_chat", input={"messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        FIRST_ANSWER.parent.mkdir(parents=True, exist_ok=True)
        FIRST_ANSWER.write_text(
            f"langgraph dev, shipped langgraph.json, demo checkpoints: /ok after {ready:.1f} s; "
            f"first reply {first:.1f} s (the models built); the next {time.time() - t2:.2f} s\n"
        )
        yield url


def test_the_server_starts_without_building_the_models(chat_server):
    """Loading the graphs' module builds nothing heavy: no slow-import warning in the log
    (the models are built on first use, which LangGraph reports as a slow graph load)."""
    log = LOGS[chat_server].read_text()
    assert "Graph import exceeded the expected startup time" not in log
    assert "Loading weights" not in log.split("Application started up in")[0]


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def server_log(url: str, chars: int = 4000, thread_id: str | None = None) -> str:
    """The server log's tail, colours stripped; with ``thread_id``, its warnings, errors and
    tracebacks, and the lines that name the thread."""
    log = LOGS.get(url)
    if not (log and log.exists()):
        return "(no log)"
    text = ANSI.sub("", log.read_text())
    if thread_id is not None:
        keep = re.compile(rf"{thread_id}|error|warning|exception|traceback|^\s", re.I)
        text = "\n".join(line for line in text.splitlines() if keep.search(line))
    return text[-chars:]


def require_js_setup(browser: bool = False) -> None:
    missing = [
        p
        for p in (JS / "node_modules" / "@langchain" / "langgraph-sdk",)
        + ((JS / "node_modules" / "playwright-core", JS / "page" / "dist" / "app.js", Path(CHROMIUM)) if browser else ())
        if not p.exists()
    ]  # fmt: skip
    if missing:
        pytest.fail(f"missing {', '.join(map(str, missing))}: {SETUP}")


class NodeRuns(dict):
    """Each case's result from ``sdk_turns.mjs``, by name; ``stderr`` is the script's log."""

    stderr: str = ""
    url: str = ""


@pytest.fixture(scope="module")
def sdk_runs(chat_server, scenes, tmp_path_factory):
    """Every case of this module through ``@langchain/langgraph-sdk`` in one Node process
    (a thread each, one after the other); expected answers from the local graph."""
    require_js_setup()
    cases, expected = [], {}
    for k, shape in enumerate(SHAPES):
        inputs, want = scenes[k % len(scenes)]
        cases.append({"name": shape, "turns": [turn(inputs, shape)]})
        expected[shape] = (inputs, want)
    inputs, want = judged_agentic(scenes)
    cases.append({"name": "stream", "turns": [turn(inputs)]})
    expected["stream"] = (inputs, want)
    pdf = base64.b64encode(tiny_pdf()).decode()
    pdf_block = {"type": "file", "mimeType": "application/pdf", "data": pdf,
                 "metadata": {"filename": "report.pdf"}}  # fmt: skip
    first = scenes[0][0]
    cases += [
        {"name": "text-only", "turns": [[{"type": "text", "text": question_text(first)}]]},
        {"name": "pdf-alone", "turns": [[pdf_block]]},
        {"name": "pdf-with-question",
         "turns": [[{"type": "text", "text": "What does this report say?"}, pdf_block]]},
    ]  # fmt: skip
    broken = {"type": "image", "mimeType": "image/png",
              "data": base64.b64encode(b"not an image").decode(),
              "metadata": {"name": "broken.png"}}  # fmt: skip
    inputs, want = scenes[1]
    cases.append(
        {"name": "broken-then-good",
         "turns": [[{"type": "text", "text": question_text(inputs)}, broken], turn(inputs)]}
    )  # fmt: skip
    expected["broken-then-good"] = (inputs, want)

    path = tmp_path_factory.mktemp("sdk") / "cases.json"
    path.write_text(json.dumps(cases))
    t0 = time.time()
    proc = subprocess.run(
        ["node", str(JS / "sdk_turns.mjs"), chat_server, str(path)],
        cwd=JS, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    runs = NodeRuns()
    runs.stderr, runs.url = proc.stderr, chat_server
    print(f"sdk_turns.mjs: {len(cases)} cases in {time.time() - t0:.1f} s\n{proc.stderr}")
    for line in proc.stdout.splitlines():
        if line.strip():
            out = json.loads(line)
            out["expected"] = expected.get(out["name"])
            runs[out["name"]] = out
    if proc.returncode != 0 or len(runs) != len(cases):
        pytest.fail(
            f"sdk_turns.mjs exited {proc.returncode} with {len(runs)} of {len(cases)} cases\n"
            f"--- stderr ---\n{proc.stderr[-6000:]}\n--- server log ---\n{server_log(chat_server)}"
        )
    return runs


def case(runs: NodeRuns, name: str) -> dict:
    out = runs[name]
    if out.get("error"):
        pytest.fail(f"{name}: {out['error']}\n{diagnostics(runs, name)}")
    return out


def summary(messages) -> str:
    def short(m):
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        calls = [c.get("name") for c in m.get("tool_calls") or []]
        meta = (m.get("response_metadata") or {}).get("speceyes")
        return (
            f"  {m.get('type')}: {text[:300]!r}"
            + (f" tool_calls={calls}" if calls else "")
            + (f" speceyes={meta}" if meta else "")
        )

    return "\n".join(short(m) for m in messages or [])


def diagnostics(runs: NodeRuns, name: str) -> str:
    """What a failing assertion prints: the case's messages, its Node log, the server's log."""
    out = runs.get(name) or {}
    state = out.get("state") or {}
    lines = [line for line in runs.stderr.splitlines() if line.startswith(f"[{name}]")]
    events = [sorted({e["event"] for e in t["events"]}) for t in out.get("turns", [])]
    errors = [e["data"] for t in out.get("turns", []) for e in t["events"] if e["event"] == "error"]
    return (
        f"--- {name}: thread {out.get('thread_id')}, state messages ---\n"
        f"{summary(state.get('messages'))}\n"
        f"route={state.get('route')!r} error={state.get('error')!r} "
        f"agent_steps={len(state.get('agent_steps') or [])}\n"
        f"--- event names per turn: {events}; error events: {errors}\n"
        f"--- node stderr ---\n" + "\n".join(lines) + "\n"
        f"--- server log (the thread's lines, warnings, errors) ---\n"
        f"{server_log(runs.url, 3000, out.get('thread_id') or '-')}"
    )


# --- what every answered turn must look like ---


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def full_image_slices(b64: str) -> list[str]:
    """Runs of the full image's base64 from its middle: a thumbnail shares none of them."""
    n = len(b64)
    return [b64[int(n * f) : int(n * f) + 48] for f in (0.2, 0.35, 0.5, 0.65, 0.8, 0.95)]


def check_pixel_free(out: dict, b64: str, where: str) -> None:
    """Neither the thread's state, nor its history, nor what was streamed holds the image
    (a thumbnail is allowed); the history of one turn stays small."""
    slices = full_image_slices(b64)
    for what, value in (
        ("state", out["state"]),
        ("history", out["history"]),
        ("the streamed events", [e for t in out["turns"] for e in t["events"]]),
    ):
        text = json.dumps(value)
        assert "data:image" not in text, f"{where}: a data: URL in {what}"
        held = [s for s in slices if s in text]
        assert not held, f"{where}: the full image's base64 in {what}"
    assert out["history_bytes"] < HISTORY_MAX_BYTES, (
        f"{where}: history of one turn is {out['history_bytes']} bytes"
    )
    long = [s[:60] + "..." for s in strings(out["state"]) if len(s) > LONGEST_STATE_STRING]
    assert not long, f"{where}: strings over {LONGEST_STATE_STRING} chars in state: {long}"


def check_human_image(human: dict, thread_id: str, name: str | None) -> dict:
    """The kept image block: a thumbnail agent-chat-ui can render, a blob reference and the
    full image's URL on this server, the file name when the block carried one."""
    from PIL import Image

    content = human["content"]
    assert isinstance(content, list), content
    kinds = [b.get("type") for b in content if isinstance(b, dict)]
    images = [b for b in content if isinstance(b, dict) and b.get("type") == "image"]
    assert len(images) == 1 and set(kinds) <= {"text", "image"}, kinds
    block = images[0]
    assert block.get("mimeType") in ("image/jpeg", "image/png"), block.keys()
    raw = base64.b64decode(block["data"], validate=True)
    assert len(raw) <= THUMBNAIL_MAX_BYTES, f"thumbnail of {len(raw)} bytes"
    with Image.open(io.BytesIO(raw)) as thumb:
        assert thumb.format.lower() in block["mimeType"], (thumb.format, block["mimeType"])
        thumb.load()
    meta = block.get("metadata") or {}
    assert str(meta.get("speceyes_image", "")).startswith("blob://"), meta
    link = re.fullmatch(r"/speceyes/images/([0-9a-f]+)\?thread_id=(.+)", meta.get("url", ""))
    assert link and link[2] == thread_id, meta
    if name is not None:
        assert meta.get("name") == name, meta
    return block


def is_ai(m: dict) -> bool:
    return m.get("type") in ("ai", "AIMessageChunk")


def text_of(m: dict) -> str:
    content = m.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def check_turn(messages: list[dict], expected: dict, where: str) -> None:
    """One answered turn's messages, from its human message on: per agent tool step an AI
    message with tool calls then tool message(s); then the plain-text answer with the route
    and score in ``response_metadata.speceyes``."""
    assert messages and messages[0]["type"] == "human", f"{where}: {summary(messages)}"
    *steps, final = messages[1:]
    i, tool_steps = 0, 0
    while i < len(steps):
        call = steps[i]
        assert is_ai(call) and call.get("tool_calls"), f"{where}: not a tool step: {call}"
        i, tool_steps, results = i + 1, tool_steps + 1, 0
        while i < len(steps) and steps[i]["type"] == "tool":
            content = steps[i]["content"]
            assert isinstance(content, str) or all(
                isinstance(b, dict) and b.get("type") == "text" for b in content
            ), f"{where}: a tool message's content is not text: {str(content)[:300]}"
            i, results = i + 1, results + 1
        assert results, f"{where}: tool calls without tool messages:\n{summary(messages)}"
    want_steps = sum(1 for s in expected.get("agent_steps") or [] if s.get("tool_calls"))
    assert tool_steps == want_steps, (
        f"{where}: {tool_steps} tool steps in the thread, the agent took {want_steps}:\n"
        f"{summary(messages)}"
    )
    assert is_ai(final) and not final.get("tool_calls"), f"{where}: last is {final}"
    answer = final["content"]
    assert isinstance(answer, str), f"{where}: answer content is not plain text: {answer!r}"
    assert not re.search(r"</?[A-Za-z_]+>", answer), f"{where}: tags in the answer: {answer!r}"
    want = expected["answer"]
    assert answer == want or answer.startswith(want), f"{where}: {answer!r}, expected {want!r}"
    meta = (final.get("response_metadata") or {}).get("speceyes") or {}
    assert meta.get("route") == expected["route"] and "score" in meta, f"{where}: {meta}"


# --- a: every block shape ---


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_image_block_shape_is_answered_and_kept_as_a_thumbnail(sdk_runs, chat_server, shape):
    import httpx
    from PIL import Image

    out = case(sdk_runs, shape)
    inputs, expected = out["expected"]
    why = diagnostics(sdk_runs, shape)
    errors = [e["data"] for e in out["turns"][0]["events"] if e["event"] == "error"]
    assert not errors and not out["turns"][0]["error"], f"{errors}\n{why}"
    messages = out["state"]["messages"]
    try:
        check_turn(messages, expected, shape)
        block = check_human_image(messages[0], out["thread_id"], SHAPES[shape][1])
        check_pixel_free(out, png_b64(inputs), shape)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why}") from None

    # the full image, for this thread only
    full = httpx.get(chat_server + block["metadata"]["url"], timeout=30)
    assert full.status_code == 200, f"{full.status_code} {full.text[:300]}"
    assert full.headers["content-type"].startswith("image/"), full.headers
    with Image.open(io.BytesIO(full.content)) as got:
        original = Image.open(io.BytesIO(base64.b64decode(png_b64(inputs))))
        assert got.size == original.size
    other = sdk_runs["text-only"]["thread_id"]  # a thread that was never sent this image
    url = block["metadata"]["url"].replace(out["thread_id"], other)
    assert httpx.get(chat_server + url, timeout=30).status_code == 404


# --- b: a turn without an image ---


@pytest.mark.parametrize(
    "name, file_name",
    [("text-only", None), ("pdf-alone", "report.pdf"), ("pdf-with-question", "report.pdf")],
)
def test_a_turn_without_an_image_gets_a_reply_that_asks_for_one(sdk_runs, name, file_name):
    out = case(sdk_runs, name)
    why = diagnostics(sdk_runs, name)
    state, (only,) = out["state"], out["turns"]
    assert only["ms"] < 10_000 and not only["error"], f"{only['ms']} ms, {only['error']}\n{why}"
    messages = state["messages"]
    assert [m["type"] for m in messages] == ["human", "ai"], why
    reply = text_of(messages[-1])
    assert "image" in reply.lower(), f"{reply!r}\n{why}"
    if file_name:
        assert file_name in reply, f"{reply!r}\n{why}"
    assert not messages[-1].get("tool_calls") and state.get("agent_steps", []) == [], why
    steps = [e for e in only["events"] if e["event"].startswith("custom")]
    assert not steps, f"a model ran: {steps[:3]}\n{why}"


# --- c: an unreadable image, then the same thread goes on ---


def test_an_unreadable_image_gets_a_reply_and_the_thread_goes_on(sdk_runs):
    out = case(sdk_runs, "broken-then-good")
    inputs, expected = out["expected"]
    why = diagnostics(sdk_runs, "broken-then-good")
    bad, good = out["turns"]
    errors = [e["data"] for e in bad["events"] if e["event"] == "error"]
    assert not errors and not bad["error"], f"the failed turn's run errored: {errors}\n{why}"
    first = bad["state"]["messages"]
    assert is_ai(first[-1]) and "broken.png" in text_of(first[-1]), f"{summary(first)}\n{why}"

    assert not good["error"], why
    messages = out["state"]["messages"]
    humans = [i for i, m in enumerate(messages) if m["type"] == "human"]
    assert len(humans) == 2, why
    try:
        check_turn(messages[humans[1] :], expected, "second turn")
        check_human_image(messages[humans[1]], out["thread_id"], "scene.png")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why}") from None


# --- d: what useStream sees while the agent works ---


def root_messages(events: list[dict]) -> list[tuple[int, dict]]:
    """(index, message) of the root graph's messages events: ``messages`` (messages-tuple:
    data is [message, metadata]) or ``messages/partial|complete`` (data: a list of messages);
    a subgraph's events are namespaced (``messages|agent:...``)."""
    out = []
    for i, e in enumerate(events):
        name = e["event"]
        if name == "messages":
            out.append((i, e["data"][0]))
        elif name in ("messages/partial", "messages/complete"):
            out += [(i, m) for m in e["data"]]
    return out


def test_the_stream_shows_the_agents_tool_steps_before_the_answer(sdk_runs, scenes):
    out = case(sdk_runs, "stream")
    _, expected = out["expected"]
    why = diagnostics(sdk_runs, "stream")
    events = out["turns"][0]["events"]
    assert expected["route"] == "judged-agentic"
    final = out["state"]["messages"][-1]
    assert is_ai(final), why
    streamed = root_messages(events)
    calls = [i for i, m in streamed if is_ai(m) and m.get("tool_calls")]
    tools = [i for i, m in streamed if m.get("type") == "tool"]
    answer = [i for i, m in streamed if m.get("id") == final.get("id")] or [
        i
        for i, e in enumerate(events)
        if e["event"] == "values"
        and final.get("id") in {m.get("id") for m in e["data"].get("messages", [])}
    ]
    names = sorted({e["event"] for e in events})
    assert calls and tools, f"no tool steps among the streamed messages (events: {names})\n{why}"
    assert answer and max(calls[0], tools[0]) < answer[0], (
        f"tool steps at {calls[:3]}, {tools[:3]}; answer at {answer[:3]}\n{why}"
    )
    custom = [
        e["data"] for e in events if e["event"] == "custom" or e["event"].startswith("custom|")
    ]
    steps = [d for d in custom if isinstance(d, dict) and any(k.endswith("_step") for k in d)]
    assert steps, f"no agent steps among {len(custom)} custom events\n{why}"
    meta = (final.get("response_metadata") or {}).get("speceyes") or {}
    assert meta.get("route") == "judged-agentic", f"{meta}\n{why}"


# --- e: the page on useStream, in Chromium ---


@pytest.fixture(scope="module")
def page_server():
    """The test page (tests/js/page) on a loopback static server, another origin than the
    langgraph server's (so the page's calls are cross-origin, as a deployed UI's are)."""
    handler = functools.partial(QuietHandler, directory=str(JS / "page"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def browser_turn(chat_server, page_server, scenes, tmp_path_factory):
    """A person's turn on the page in Chromium (``tests/js/browser_turn.mjs``) on a
    judged-agentic scene: pick the scene's PNG, type the question, send, wait for the answer
    and the agent's tool calls; screenshot; reload (the thread id is in the URL) and wait
    for the thread to come back from the server, the image's thumbnail included. Returns
    the script's exit status, log, and result (None when it did not get to the end)."""
    import httpx

    require_js_setup(browser=True)
    # CORS: langgraph dev answers another origin's preflight (CORS_ALLOW_ORIGINS defaults to *)
    preflight = httpx.options(
        chat_server + "/threads/search",
        headers={"Origin": page_server, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"},
    )  # fmt: skip
    allowed = preflight.headers.get("access-control-allow-origin")
    assert preflight.status_code == 200 and allowed in ("*", page_server), preflight.headers

    inputs, expected = judged_agentic(scenes)
    folder = tmp_path_factory.mktemp("browser")
    image = folder / "scene.png"
    image.write_bytes(base64.b64decode(png_b64(inputs)))
    shot = Path(os.environ.get("SPECEYES_CHAT_UI_SCREENSHOT") or folder / "chat-ui.png").resolve()
    shot.parent.mkdir(parents=True, exist_ok=True)
    url = f"{page_server}/index.html?{urlencode({'apiUrl': chat_server})}"
    t0 = time.time()
    proc = subprocess.run(
        ["node", str(JS / "browser_turn.mjs"), url, str(image), question_text(inputs),
         expected["answer"], str(shot), "--expect-tool-calls"],
        cwd=JS, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    print(f"browser_turn.mjs: {time.time() - t0:.1f} s\n{proc.stderr}")
    thread = re.search(r"threadId=([0-9a-f-]+)", proc.stderr + proc.stdout)
    log = server_log(chat_server, 3000, thread[1] if thread else "(?!)")
    lines = proc.stdout.strip().splitlines()
    return {
        "rc": proc.returncode,
        "result": json.loads(lines[-1]) if proc.returncode == 0 and lines else None,
        "why": f"--- browser_turn.mjs stderr ---\n{proc.stderr[-8000:]}\n"
        f"--- server log (the thread's lines, warnings, errors) ---\n{log}",
        "screenshot": shot,
    }


@pytest.mark.browser
def test_the_use_stream_page_in_chromium(browser_turn):
    """The page answers as the graph does, shows the agent's tool calls and tool results
    (with the crop the model looked at), and after a reload shows the thread again: the human message's image (the kept
    thumbnail, as agent-chat-ui renders it), the answer, the tool calls. Set
    SPECEYES_CHAT_UI_SCREENSHOT=docs/images/chat-ui.png to refresh the documentation's
    picture."""
    assert browser_turn["rc"] == 0, (
        f"browser_turn.mjs exited {browser_turn['rc']}\n" + (browser_turn["why"])
    )
    after = browser_turn["result"]["after"]
    humans = [m for m in after["messages"] if m["kind"] == "human-message"]
    assert humans and humans[0]["images"][0]["naturalWidth"] > 0, after
    assert any(m["tool_calls"] for m in after["messages"]), after
    tools = [m for m in after["messages"] if m["kind"] == "tool-message"]
    assert tools, after
    # the crop the model looked at (the tool message's artifact), rendered
    assert any(i["naturalWidth"] > 0 for m in tools for i in m["images"]), tools
    assert browser_turn["screenshot"].stat().st_size > 0


@pytest.mark.browser
def test_the_conversation_stays_on_screen_while_the_run_streams(browser_turn):
    """agent-chat-ui submits with ``streamSubgraphs: true``, and useStream (1.8) takes every
    ``values`` event as the thread's values, a subgraph's (``values|<namespace>``) included:
    a subgraph state without the conversation's ``messages`` blanks the thread on screen
    until the run ends. Every render while the run streams shows the human message."""
    result = browser_turn["result"]
    if result is None:
        pytest.fail("the browser turn did not get that far\n" + browser_turn["why"])
    streaming = result["streaming"]
    assert streaming["while_loading"] > 0, streaming
    assert streaming["without_the_human_message"] == 0, (
        f"{streaming['without_the_human_message']} of {streaming['while_loading']} renders "
        f"while the run streamed showed no human message (the message kinds rendered: "
        f"{streaming['kinds_seen']})\n{browser_turn['why']}"
    )
