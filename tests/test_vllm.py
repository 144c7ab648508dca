"""The served path against the engine users deploy: real vLLM servers (``-m vllm``).

The replay-server tests (``test_serving.py``) check what the graph sends; these check what a
real engine sends back. On the same checkpoints, the graph over vLLM must do what it does on
the transformers path: same routes and answers, the same scored tokens per draft, per-token
separability within 1e-3, and the same prompt length for every model call (so the image the
server received is the size our frame assumes, and the chat template rendered the same turn).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

pytest.importorskip("langchain_openai", reason="the openai extra")

from engine_parity import (  # noqa: E402
    CONFIGURATIONS,
    assert_same,
    local_run,
    run_configuration,
)

from speceyes_graph import LoopOptions, create_speceyes_chat_graph  # noqa: E402
from speceyes_graph.demo import (  # noqa: E402
    DEMO_GRAPH_SETTINGS,
)
from speceyes_graph.demo.engines import served_models  # noqa: E402
from speceyes_graph.gate.separability import GateConfig  # noqa: E402
from speceyes_graph.messages import for_model, user_message  # noqa: E402
from speceyes_graph.models import openai_chat_model  # noqa: E402
from speceyes_graph.models.served import ServedModelError  # noqa: E402
from speceyes_graph.prompts import THYME_SYSTEM_PROMPT  # noqa: E402
from speceyes_tools import ImageStore  # noqa: E402
from speceyes_tools.images import store_scope  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(vllm_servers):
    small, large = vllm_servers["small"], vllm_servers["large"]
    return served_models(
        {"small": small.url, "large": large.url}, {"small": "small", "large": "large"}
    )


@pytest.mark.parametrize("configuration", list(CONFIGURATIONS))
def test_the_graph_over_vllm_matches_the_transformers_path(
    demo_local, served, demo_queries_60, configuration
):
    mode, settings, _ = CONFIGURATIONS[configuration]
    served_run = run_configuration(served, configuration, demo_queries_60)
    assert_same(local_run(demo_local, configuration, demo_queries_60), served_run)
    outs = served_run[0]
    routes = {o["route"] for o in outs}
    if mode == "speceyes":  # the comparison covers every route
        base = routes - {"speculative-tools"}
        assert base == {"speculative", "judged-agentic"} or "rejected-agentic" in base, routes
        assert any(o["agent_steps"] and o["agent_steps"][0].get("tool_calls") for o in outs)
    if getattr(settings.get("speculation"), "depth", 0):  # the small loop ran on the server
        assert all(o["tool_draft"] for o in outs if o["judge_output"].startswith("yes"))


def test_the_end_of_turn_token_is_not_scored(served, demo_local, demo_queries_60):
    """vLLM returns <|im_end|> as the last log-prob entry; the gate scores the answer only."""
    msgs = [
        SystemMessage("x"),
        HumanMessage([{"type": "text", "text": demo_queries_60[0]["question"]}]),
    ]
    raw = served["small"].invoke(msgs, max_tokens=8)
    content = raw.response_metadata["logprobs"]["content"]
    assert raw.response_metadata["finish_reason"] == "stop"
    assert content[-1]["token"] == "<|im_end|>"  # what the engine sends ...
    scored = GateConfig().evaluate(raw.response_metadata["logprobs"])
    assert scored["tokens"] == [e["token"] for e in content[:-1]]  # ... and what is scored
    assert "<|im_end|>" not in scored["tokens"]


def test_the_server_says_what_it_serves(vllm_servers, demo_local):
    """Served under names of their own, the checkpoints still get their own image frame and
    context length, asked of the server (not guessed from 'small' / 'large')."""
    for role in ("small", "large"):
        server = vllm_servers[role]
        model = openai_chat_model(server.url, role, top_logprobs=64 if role == "small" else None)
        assert model.resize_spec == demo_local[role].resize_spec
        assert model.context_length == 4096  # --max-model-len
        assert Path(model.served_root) == Path(server.model)


def test_a_server_below_k_log_probs_is_reported_before_the_run(vllm_servers):
    server = vllm_servers["small"]  # started with --max-logprobs 64
    with pytest.raises(ServedModelError, match="--max-logprobs 65"):
        openai_chat_model(server.url, "small", top_logprobs=65)
    with pytest.raises(ServedModelError, match="serves \\['small'\\], not 'Qwen"):
        openai_chat_model(server.url, "Qwen/Qwen3-VL-2B-Instruct", top_logprobs=64)


class Tokens(BaseCallbackHandler):
    def __init__(self):
        self.n = 0

    def on_llm_new_token(self, token, **kwargs):
        self.n += 1


def chat_input(query):
    data = base64.b64encode(Path(query["images"][0]).read_bytes()).decode()
    text = query["question"] + "\nOptions: " + ", ".join(query["options"])
    image = {"type": "image", "base64": data, "mime_type": "image/png"}
    return {"messages": [HumanMessage([{"type": "text", "text": text}, image])]}


def test_streaming_clients_through_the_chat_graph(vllm_servers, demo_local, demo_queries_60):
    """ChatOpenAI(streaming=True) against the real server: every model call streams (SSE,
    the draft's log-probs inside the chunks), the chat graph routes and answers as it does on
    the local models, and its zooms and answer come out of stream_mode="messages"."""
    urls = {r: vllm_servers[r].url for r in ("small", "large")}
    streaming = {
        "small": openai_chat_model(urls["small"], "small", top_logprobs=64, max_tokens=8, streaming=True),
        "large": openai_chat_model(urls["large"], "large", max_tokens=256, streaming=True),
    }  # fmt: skip
    graphs = {
        name: create_speceyes_chat_graph(
            speculator=models["small"], agent=models["large"], **DEMO_GRAPH_SETTINGS
        ).compile()
        for name, models in (("local", demo_local), ("streaming", streaming))
    }
    routes = set()
    for query in demo_queries_60[:8]:
        tokens = Tokens()
        expected = graphs["local"].invoke(chat_input(query))
        chunks, final = [], {}
        for mode, part in graphs["streaming"].stream(
            chat_input(query), {"callbacks": [tokens]}, stream_mode=["messages", "values"]
        ):
            if mode == "messages" and part[0].content:
                chunks.append(part[0])
            elif mode == "values":
                final = part
        assert tokens.n > 0  # the server streamed
        assert final["route"] == expected["route"] and final.get("error") is None
        answer = final["messages"][-1].content
        assert answer == expected["messages"][-1].content
        # the stream carries the zooms (tool calls, results) and then the answer, once each
        assert [c.type for c in chunks] == [m.type for m in final["messages"][1:] if m.content]
        assert chunks[-1].content == answer
        routes.add(final["route"])
    assert "speculative" in routes  # a draft scored from streamed log-probs, and accepted


def thyme_turn(store, image_path, resize):
    """A Thyme conversation as the agent sends it after one code step: the question, then
    the assistant turn holding the code and the sandbox's output image, to be continued."""
    user = user_message([image_path], "What is the colour of the object?", resize, store)
    ai = AIMessage(
        [
            {
                "type": "text",
                "text": "<think>crop</think>\n<code>\n```python\nprint(1)\n```\n</code>",
            },
            {"type": "text", "text": "<sandbox_output>"},
            user.content[0],  # the image, as a blob:// reference in the model's frame
            {"type": "text", "text": "</sandbox_output>"},
        ]
    )
    return [SystemMessage(THYME_SYSTEM_PROMPT), user, ai]


def test_thyme_continues_the_same_turn_on_vllm(vllm_servers, demo_local, scene):
    """continue_final_message on the real server renders the turn as the local chat template
    does (same prompt tokens: no new assistant header) and continues it with the same tokens
    (the demo's Qwen2.5-VL checkpoint, 2.8M parameters)."""
    store = ImageStore()
    model = demo_local["large"]
    served = openai_chat_model(vllm_servers["large"].url, "large", max_tokens=24)
    assert served.resize_spec == model.resize_spec
    wire = thyme_turn(store, scene, model.resize_spec)
    with store_scope(store):
        a = model.invoke(for_model(wire, model, store), max_tokens=24)
        b = served.invoke(
            for_model(wire, served, store),
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
        fresh = served.invoke(for_model(wire, served, store))  # a new turn instead
    assert a.usage_metadata["input_tokens"] == b.usage_metadata["input_tokens"]
    assert fresh.usage_metadata["input_tokens"] > b.usage_metadata["input_tokens"]
    assert a.content == b.content and a.content


def test_speceyes_bench_on_a_served_model(vllm_servers, tmp_path):
    """`speceyes bench --small openai:URL#small`: a gate K above the server's --max-logprobs
    stops before the run with the flag to set; within it, the run goes."""
    import json
    import subprocess
    import sys

    from speceyes_graph.benchmarks import generate_suite

    generate_suite(tmp_path / "suite", 2, seed=3, max_side=600)
    spec = f"openai:{vllm_servers['small'].url}#small"

    def bench(*args):
        return subprocess.run(
            [sys.executable, "-m", "speceyes_graph.cli", "bench", "--benchmark", "synthetic",
             "--data", str(tmp_path / "suite"), "--mode", "small", "--small", spec, *args],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    r = bench("--top-k", "65", "--out", str(tmp_path / "refused"))
    assert r.returncode == 2 and "--max-logprobs 65" in r.stderr and "Traceback" not in r.stderr
    r = bench("--top-k", "64", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").open()]
    assert len(records) == 2 and all(rec["error"] is None for rec in records)


def test_a_family_of_another_kind_served_by_vllm(tiny_families, tmp_path):
    """Mistral 3 (Pixtral's frame, a Tekken tokenizer, a template that writes the BOS), served
    by vLLM: the frame read from the served checkpoint is the local processor's, its boxes are
    said to be of no known convention, and the graph with it as judge, speculator and agent
    finishes queries of one and of two images, batched, with every draft scored."""
    import numpy as np
    from PIL import Image

    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.models import ChatTransformersVLM
    from speceyes_graph.models.servers import VLLMServer

    folder = tiny_families["mistral3"]
    local = ChatTransformersVLM(model=str(folder), max_new_tokens=4)
    images = []
    for seed, (w, h) in enumerate(((90, 60), (33, 77), (64, 64))):
        path = tmp_path / f"{seed}.png"
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), np.uint8)).save(
            path
        )
        images.append(str(path))
    queries = [
        {"question": "What colour is it?", "images": images[:1]},
        {"question": "Which is redder?", "images": images[1:], "options": ["first", "second"]},
    ]
    with VLLMServer(folder, name="mistral3") as server:
        small = openai_chat_model(server.url, "mistral3", top_logprobs=8, max_tokens=4)
        large = openai_chat_model(server.url, "mistral3", max_tokens=8)
        assert small.resize_spec == local.resize_spec
        assert small.resize_spec.max_side is not None  # Pixtral's longest edge, not Qwen's area
        assert small.box_coordinates is None
        for mode in ("small", "speceyes", "agent"):
            graph = create_speceyes_graph(
                speculator=small, agent=large, tools="deepeyes", mode=mode,
                gate=GateConfig(tau=0.0, k=8), loop=LoopOptions(max_steps=2),
            ).compile()  # fmt: skip
            for out in graph.batch(queries):
                assert out["error"] is None, (mode, out["error"])
                if out["draft"]:
                    assert out["draft"]["score"] is not None, mode
                if mode != "small":
                    assert out["judge_output"] is not None or mode == "agent"
                    assert out["agent_steps"] or out["route"] == "speculative", mode
