"""The graph over HTTP: the real ChatOpenAI client against a vLLM-format replay server."""

import asyncio
import base64
import io
import json
from collections import Counter

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("langchain_openai", reason="the openai extra")

from conftest import write_scene  # noqa: E402
from vllm_replay import ReplayServer, completion, logprobs_content  # noqa: E402

from speceyes_graph import GateConfig, create_speceyes_graph  # noqa: E402
from speceyes_graph.models import openai_chat_model, openai_models  # noqa: E402
from speceyes_tools import ResizeSpec  # noqa: E402

SERVER_ERROR = {
    "object": "error",
    "message": "CUDA error: an illegal memory access",
    "type": "InternalServerError",
    "param": None,
    "code": 500,
}


def texts(body):
    out = []
    for m in body["messages"]:
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out += [p.get("text", "") for p in c if p.get("type") == "text"]
    return "\n".join(out)


def images(message):
    c = message.get("content")
    return (
        [p["image_url"]["url"] for p in c if p.get("type") == "image_url"]
        if isinstance(c, list)
        else []
    )


def make_respond(cap=64, attempts=None):
    attempts = attempts if attempts is not None else Counter()

    def respond(body):
        text, model = texts(body), body["model"]
        key = (model, text)
        attempts[key] += 1
        if "always-broken" in text:
            return 500, SERVER_ERROR, 0
        if "flaky" in text and attempts[key] == 1:
            return 500, SERVER_ERROR, 0
        delay = 3.0 if "slow" in text and model == "small" else 0.02
        if model == "small":
            sep = 9.0 if "easy" in text else 3.0
            k = min(body.get("top_logprobs") or 0, cap)
            return (
                200,
                completion(
                    model,
                    "A",
                    logprobs=logprobs_content(["A"], [sep], k) if body.get("logprobs") else None,
                ),
                delay,
            )
        if "Would tools significantly improve" in text:
            return 200, completion(model, "yes" if "hard" in text else "no"), delay
        last = body["messages"][-1]
        if model == "native":
            if last["role"] == "user" and images(last) and len(body["messages"]) > 2:
                return 200, completion(model, "<answer>red</answer>"), delay
            call = {
                "id": "chatcmpl-tool-1",
                "type": "function",
                "function": {
                    "name": "zoom",
                    "arguments": json.dumps({"bbox": [100, 100, 300, 300]}),
                },
            }
            return 200, completion(model, None, tool_calls=[call]), delay
        if "<tool_response>" in texts({"messages": [last]}):
            return 200, completion(model, "<think>clear now</think><answer>B</answer>"), delay
        return (
            200,
            completion(
                model,
                '<think>small</think><tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [100, 100, 300, 300]}}\n</tool_call>',
            ),
            delay,
        )

    return respond


@pytest.fixture
def scene4k(tmp_path):
    return write_scene(tmp_path / "4k.png", size=(3840, 2160), box=(400, 400, 800, 800))


def graph_for(url, **kw):
    gate = kw.pop("gate", GateConfig())
    models = openai_models(
        url,
        "small",
        url,
        "large",
        timeout=kw.pop("timeout", 10),
        max_retries=kw.pop("max_retries", 2),
    )
    return create_speceyes_graph(**models, gate=gate, **kw).compile()


def q(text, scene):
    return {"question": text, "images": [scene], "options": ["red", "blue"]}


def test_routes_and_scores_over_http(scene4k):
    with ReplayServer(make_respond()) as server:
        outs = graph_for(server.url).batch(
            [
                q("easy: colour?", scene4k),
                q("hard: colour?", scene4k),
                q("unsure: colour?", scene4k),
            ],
            {"max_concurrency": 3},
        )
    assert [o["route"] for o in outs] == ["speculative", "judged-agentic", "rejected-agentic"]
    assert outs[0]["answer"] == "A" and outs[1]["answer"] == "B" and outs[2]["answer"] == "B"
    assert outs[0]["draft"]["separability"] == pytest.approx(9.0, rel=1e-5)
    assert outs[2]["draft"]["separability"] == pytest.approx(3.0, rel=1e-5)
    small_requests = [r for r in server.requests if r["model"] == "small"]
    assert all(
        r["logprobs"] is True
        and r["top_logprobs"] == 64
        and r["max_completion_tokens"] == 20
        and r["temperature"] == 0
        for r in small_requests
    )
    judge_requests = [
        r for r in server.requests if r["model"] == "large" and "Would tools" in texts(r)
    ]
    assert all(r["max_completion_tokens"] == 10 for r in judge_requests)


def test_images_go_out_resized_and_crops_come_back_as_user_turns(scene4k):
    with ReplayServer(make_respond()) as server:
        graph_for(server.url).invoke(q("hard: colour?", scene4k))
    expected = ResizeSpec().size(3840, 2160)
    agent_requests = [
        r for r in server.requests if r["model"] == "large" and "Would tools" not in texts(r)
    ]
    first, second = agent_requests
    full = images(first["messages"][1])[0]
    assert full.startswith("data:image/png;base64,")
    assert (
        Image.open(io.BytesIO(base64.b64decode(full.split(",", 1)[1]))).size == expected
    )  # not the 4K original
    roles = [m["role"] for m in second["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert "<tool_call>" in second["messages"][2]["content"]
    crop_turn = second["messages"][3]
    assert (
        texts({"messages": [crop_turn]}).startswith("<tool_response>")
        and len(images(crop_turn)) == 1
    )
    assert not any(images(m) for m in second["messages"] if m["role"] == "tool")


def test_native_tool_calls_over_http_keep_images_out_of_tool_messages(scene4k):
    with ReplayServer(make_respond()) as server:
        agent = openai_chat_model(server.url, "native", timeout=10)
        out = (
            create_speceyes_graph(agent=agent, mode="agent", tools="vision")
            .compile()
            .invoke(q("colour?", scene4k))
        )
    assert out["answer"] == "red" and out["agent_steps"][0]["tool_calls"][0]["name"] == "zoom"
    second = server.requests[-1]
    assert [m["role"] for m in second["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert (
        isinstance(second["messages"][3]["content"], str)
        and len(images(second["messages"][4])) == 1
    )
    assert second["tools"][0]["function"]["name"] == "crop"


def test_short_top_logprobs_are_detected_not_silently_scored(scene4k):
    with ReplayServer(make_respond(cap=20)) as server:
        strict = graph_for(server.url).invoke(q("easy: colour?", scene4k))
        clamped = graph_for(server.url, gate=GateConfig(clamp=True)).invoke(
            q("easy: colour?", scene4k)
        )
    assert strict["route"] == "rejected-agentic" and "--max-logprobs 64" in strict["draft"]["error"]
    assert clamped["route"] == "speculative" and "clamped from 64" in clamped["draft"]["note"]
    assert len(clamped["draft"]["top_logprobs"][0]) == 20


def test_retries_errors_and_timeouts_fail_only_their_query(scene4k):
    attempts = Counter()
    with ReplayServer(make_respond(attempts=attempts)) as server:
        g = graph_for(server.url, timeout=1.0, max_retries=1)
        outs = g.batch(
            [
                q("easy flaky: colour?", scene4k),
                q("easy always-broken: colour?", scene4k),
                q("easy slow: colour?", scene4k),
                q("easy: colour?", scene4k),
            ],
            {"max_concurrency": 4},
        )
    assert outs[0]["route"] == "speculative"  # a 500, retried with backoff, then fine
    assert max(n for (m, t), n in attempts.items() if "flaky" in t) == 2
    assert (
        "judge" in outs[1]["error"] and "500" in outs[1]["error"]
    )  # persistent 5xx: that query fails
    assert (
        outs[2]["route"] == "rejected-agentic" and "Timeout" in outs[2]["draft"]["error"]
    )  # draft timed out: fallback
    assert outs[3]["route"] == "speculative" and outs[3].get("error") is None


def test_concurrency_is_bounded_by_max_concurrency(scene4k):
    with ReplayServer(make_respond()) as server:
        graph_for(server.url).batch(
            [q(f"easy {i}: colour?", scene4k) for i in range(12)], {"max_concurrency": 4}
        )
    assert 2 <= server.max_in_flight <= 4
    assert len(server.requests) == 24  # a judge and a draft request per query


def test_short_lists_from_real_model_servers_shape():
    content = logprobs_content(["A", "B"], [8.0, 7.0], 64)["content"]
    assert all(len(e["top_logprobs"]) == 64 for e in content) and np.isclose(
        content[0]["logprob"], content[0]["top_logprobs"][0]["logprob"]
    )


def test_langgraph_json_points_at_a_compiled_graph(monkeypatch):
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = json.loads((root / "langgraph.json").read_text())
    path, attr = cfg["graphs"]["speceyes"]["path"].split(":")
    assert "N_JOBS_PER_WORKER" in cfg["graphs"]["speceyes"]["description"]
    for var in (
        "SPECEYES_SMALL_URL",
        "SPECEYES_LARGE_URL",
        "SPECEYES_SMALL_PATH",
        "SPECEYES_LARGE_PATH",
    ):
        monkeypatch.delenv(var, raising=False)
    factory = runpy.run_path(str(root / path))[attr]  # a graph factory, built on first use
    graph = asyncio.run(factory())
    assert {"judge", "speculate", "gate", "agent_loop"} <= set(graph.get_graph().nodes)


def test_studio_graph_from_environment(monkeypatch, scene4k, tmp_path):
    import os
    import runpy
    from pathlib import Path

    monkeypatch.setenv("SPECEYES_IMAGE_DIRS", os.path.dirname(scene4k))  # served: allow-listed
    monkeypatch.setenv("SPECEYES_BLOB_DIR", str(tmp_path / "blobs"))
    with ReplayServer(make_respond()) as server:
        monkeypatch.setenv("SPECEYES_SMALL_URL", server.url)
        monkeypatch.setenv("SPECEYES_SMALL_MODEL", "small")
        monkeypatch.setenv("SPECEYES_LARGE_URL", server.url)
        monkeypatch.setenv("SPECEYES_LARGE_MODEL", "large")
        studio = runpy.run_path(
            str(Path(__file__).resolve().parents[1] / "speceyes_graph/integrations/studio.py")
        )  # a fresh copy of the module: the graphs from this environment
        graph = studio["served_graph"]("speceyes")
        assert graph.invoke(q("easy: colour?", scene4k))["route"] == "speculative"


def test_served_models_see_their_familys_resolution(tmp_path):
    """A V*-sized image goes to DeepEyes within Qwen2.5-VL's limits (up to 12.8 MP, sides
    multiples of 28) and to Qwen3-VL within its own (multiples of 32), not shrunk to 1 MP."""
    from speceyes_graph.models.families import FAMILIES

    wide = write_scene(tmp_path / "vstar.png", size=(5759, 1440), box=(100, 100, 160, 160))
    names = {"Qwen/Qwen3-VL-2B-Instruct": "small", "ChenShawn/DeepEyes-7B": "large"}
    inner = make_respond()

    def respond(body):
        return inner({**body, "model": names[body["model"]]})

    with ReplayServer(respond) as server:
        models = openai_models(
            server.url, "Qwen/Qwen3-VL-2B-Instruct", server.url, "ChenShawn/DeepEyes-7B", timeout=10
        )
        create_speceyes_graph(**models).compile().invoke(q("easy: colour?", wide))
    sizes = {}
    for r in server.requests:
        url = images(r["messages"][1])[0]
        sizes[r["model"]] = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size
    assert sizes["ChenShawn/DeepEyes-7B"] == FAMILIES["qwen2.5-vl"].size(5759, 1440) == (5768, 1428)
    assert sizes["Qwen/Qwen3-VL-2B-Instruct"] == FAMILIES["qwen3-vl"].size(5759, 1440)
    assert sizes["Qwen/Qwen3-VL-2B-Instruct"][0] % 32 == 0
    # and a spec can override the limits
    from speceyes_graph.models.specs import parse_model_spec

    spec = parse_model_spec(
        "openai:http://h:1/v1#Qwen/Qwen3-VL-2B-Instruct?max_pixels=1003520", "small"
    )
    assert spec.resize.max_pixels == 1003520 and spec.resize.factor == 32


def test_studio_serves_thyme_with_its_published_defaults(monkeypatch, scene4k, tmp_path):
    """SPECEYES_TOOLS=thyme: the served graph speaks Thyme, tau 0.95, 2048 tokens a step."""
    import importlib

    from speceyes_graph.integrations import studio

    monkeypatch.setenv("SPECEYES_TOOLS", "thyme")
    monkeypatch.setenv("SPECEYES_SMALL_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SPECEYES_LARGE_URL", "http://127.0.0.1:9/v1")
    importlib.reload(studio)
    try:
        settings = studio.served_models()
        assert settings["gate"].tau == 0.95 and settings["tools"] == "thyme"
        assert settings["agent"].max_tokens == 2048
    finally:
        monkeypatch.undo()
        importlib.reload(studio)


def served_entry(name, root, length=8192):
    return {
        "id": name,
        "object": "model",
        "owned_by": "vllm",
        "root": root,
        "max_model_len": length,
    }


def test_the_client_asks_the_server_what_it_serves():
    """A model served as 'small': its family and context length come from /v1/models."""
    from speceyes_graph.models.families import FAMILIES

    models = [
        served_entry("small", "Qwen/Qwen3-VL-2B-Instruct"),
        served_entry("large", "ChenShawn/DeepEyes-7B", 32768),
    ]
    with ReplayServer(make_respond(), models=models) as server:
        small = openai_chat_model(server.url, "small", top_logprobs=64)
        large = openai_chat_model(server.url, "large")
        probes = list(server.requests)
    assert small.resize_spec == FAMILIES["qwen3-vl"] and small.context_length == 8192
    assert large.resize_spec == FAMILIES["qwen2.5-vl"] and large.context_length == 32768
    [probe] = probes  # one one-token request, for the speculator only
    assert probe["top_logprobs"] == 64 and probe["max_tokens"] == 1


def test_a_server_that_silently_returns_fewer_log_probs_is_reported():
    from speceyes_graph.models.served import ServedModelError

    entry = served_entry("small", "Qwen/Qwen3-VL-2B-Instruct")
    with ReplayServer(make_respond(cap=20), models=[entry]) as server:
        with pytest.raises(
            ServedModelError,
            match="returned 20 top log-probs of 64; start it with --max-logprobs 64",
        ):
            openai_chat_model(server.url, "small", top_logprobs=64)
        openai_chat_model(server.url, "small", top_logprobs=20)  # enough for k=20


def test_a_server_that_cannot_say_its_frame_is_refused_with_the_fixes():
    """A reachable server whose listing is not OpenAI's (vllm-router --enable-igw lists
    {"models": [...]}), or whose entry names no checkpoint, serving a name of no known family:
    refused when the client is built, naming each way on; each works, and the top-log-probs
    check runs whatever the listing said."""
    from speceyes_graph.models.families import FAMILIES
    from speceyes_graph.models.served import ServedModelError

    with ReplayServer(make_respond(cap=20), models={"models": ["small", "large"]}) as server:
        with pytest.raises(ServedModelError, match="not OpenAI's listing") as refused:
            openai_chat_model(server.url, "small")
        for fix in ("resize=", "?max_pixels=", "default_frame=True", "one router"):
            assert fix in str(refused.value)
        assert openai_chat_model(server.url, "small", default_frame=True).resize_spec == ResizeSpec()
        frame = ResizeSpec(factor=32, min_pixels=4096, max_pixels=65536)
        assert openai_chat_model(server.url, "small", resize=frame).resize_spec is frame
        named = openai_chat_model(server.url, "Qwen/Qwen3-VL-2B-Instruct")  # a family: its frame
        assert named.resize_spec == FAMILIES["qwen3-vl"]
        with pytest.raises(ServedModelError, match="returned 20 top log-probs of 64"):
            openai_chat_model(server.url, "small", top_logprobs=64, default_frame=True)
    with ReplayServer(make_respond(), models=[served_entry("small", None)]) as server:
        with pytest.raises(ServedModelError, match="names no checkpoint"):
            openai_chat_model(server.url, "small")
    with ReplayServer(make_respond(), models=[served_entry("small", "acme/vision-9")]) as server:
        with pytest.raises(ServedModelError, match="'acme/vision-9' is no folder"):
            openai_chat_model(server.url, "small")
    # a server not reached yet (it may start after the graph): the default, warned
    assert openai_chat_model("http://127.0.0.1:9/v1", "small").resize_spec == ResizeSpec()


def test_a_checkpoint_folder_the_server_names_gives_its_own_frame(tmp_path):
    """root is a folder readable here (a local server): its processor config, exactly."""
    import json as _json

    from speceyes_graph.demo import demo_checkpoints
    from speceyes_graph.models.families import processor_resize
    from speceyes_graph.models.served import ServedModelInfo, served_resize

    for role, path in demo_checkpoints().items():
        config = _json.loads((path / "processor_config.json").read_text())["image_processor"]
        got = served_resize(role, ServedModelInfo(role, str(path), 4096))
        assert got == processor_resize(config)
    assert (
        served_resize("small", ServedModelInfo("small", "/srv/models/Qwen3-VL-2B", None)).factor
        == 32
    )
    assert served_resize("mystery", None).max_pixels == ResizeSpec().max_pixels  # 1 MP, warned
    explicit = ResizeSpec(factor=28, min_pixels=3136, max_pixels=500_000)
    assert openai_chat_model("http://127.0.0.1:9/v1", "x", resize=explicit).resize_spec is explicit


def test_the_servers_context_length_bounds_the_question(scene4k):
    """max_model_len from /v1/models: a question that cannot fit fails its query, clearly,
    before any model call; the other query of the batch is answered."""
    models = [
        served_entry("small", "Qwen/Qwen3-VL-2B-Instruct", 2048),
        served_entry("large", "ChenShawn/DeepEyes-7B", 2048),
    ]
    with ReplayServer(make_respond(), models=models) as server:
        graph = create_speceyes_graph(
            **openai_models(server.url, "small", server.url, "large")
        ).compile()
        long, short = graph.batch(
            [q("easy: colour? " + "very " * 1200, scene4k), q("easy: colour?", scene4k)]
        )
    assert not any("very very" in texts(r) for r in server.requests)  # no model call
    assert long["error"] and "accepts at most 1024" in long["error"] and long["answer"] is None
    assert short["error"] is None and short["route"] == "speculative"


def test_servers_loading_serve_py_per_graph_id_build_the_graphs_once():
    """langgraph.json names speceyes_graph/serve.py for each graph id, and a server executes
    that file once per id, at start: loading it builds nothing (no model, no torch), and its
    factories give the same graphs (and the models behind them), built once per process on
    first use, whichever copy of the file is asked."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    paths = {
        g["path"].split(":")[0]
        for g in json.loads((root / "langgraph.json").read_text())["graphs"].values()
    }
    assert paths == {"./speceyes_graph/serve.py"}
    code = (
        "import asyncio, runpy, sys\n"
        f"a = runpy.run_path({str(root / 'speceyes_graph/serve.py')!r})\n"
        f"b = runpy.run_path({str(root / 'speceyes_graph/serve.py')!r})\n"
        "from speceyes_graph.integrations import studio\n"
        "assert not studio._built and 'torch' not in sys.modules, 'built at import'\n"
        "async def both(name):\n"
        "    return await asyncio.gather(a[name](), b[name](), a[name]())\n"
        "for name in ('graph', 'chat_graph'):\n"
        "    x, y, z = asyncio.run(both(name))\n"
        "    assert x is y is z, name\n"
        "print('once')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPECEYES_MODELS": "example"},
    )  # fmt: skip
    assert done.returncode == 0 and "once" in done.stdout, done.stderr[-2000:]


def test_a_port_given_to_one_server_is_not_given_to_the_next(monkeypatch):
    """Servers bind their ports seconds after launch, so the kernel can offer a port already
    handed to a server that has not bound it yet (a router's metrics port, picked again as
    the next router's own: its /v1/models then answered with metrics, in CI). The picker
    never hands out a port twice."""
    from speceyes_graph.models import servers

    offered = iter([41001, 41001, 41002, 41001, 41003])

    class Kernel:  # bind((host, 0)) gets the next port the kernel would offer
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(servers.socket, "socket", Kernel)
    monkeypatch.setattr(servers, "_HANDED_OUT", set(), raising=False)
    assert [servers.free_port("127.0.0.1") for _ in range(3)] == [41001, 41002, 41003]


def test_two_threads_picking_ports_at_once_never_share_one(monkeypatch):
    """Fixtures start servers from several threads; two threads offered the same port by the
    kernel must not both take it. The handed-out set below holds every check at a barrier,
    so without the picker's lock both threads see the port as free at once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from speceyes_graph.models import servers

    offered = iter([41001, 41001, 41002, 41003])
    offering = threading.Lock()
    both_checking = threading.Barrier(2, timeout=0.5)

    class Kernel:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            with offering:
                self.port = next(offered)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    class SlowToCheck(set):
        def __contains__(self, port):
            seen = super().__contains__(port)
            try:
                both_checking.wait()  # the second thread's check, if it can start, meets this one
            except threading.BrokenBarrierError:
                pass  # it could not: the first check timed out alone
            return seen

    monkeypatch.setattr(servers.socket, "socket", Kernel)
    monkeypatch.setattr(servers, "_HANDED_OUT", SlowToCheck(), raising=False)
    with ThreadPoolExecutor(2) as pool:
        ports = list(pool.map(lambda _: servers.free_port("127.0.0.1"), range(2)))
    assert sorted(ports) == [41001, 41002]
