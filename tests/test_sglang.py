"""The served path on a second engine: real SGLang servers on a CPU (``-m sglang``).

SGLang runs here without its CPU engine (see ``scripts/setup-sglang.sh``), so these tests
check what users get from it: the same answers as the transformers path, the end-of-turn
token it also returns left out of the gate, and the checkpoint asked of the server (SGLang
names it in ``/model_info``, not in ``/v1/models``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

pytest.importorskip("langchain_openai", reason="the openai extra")

from engine_parity import assert_same, local_run, run_configuration  # noqa: E402

from speceyes_graph.demo.engines import served_models  # noqa: E402
from speceyes_graph.gate.separability import GateConfig  # noqa: E402
from speceyes_graph.models import openai_chat_model  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def served(sglang_servers):
    urls = {role: s.url for role, s in sglang_servers.items()}
    return served_models(urls, {"small": "small", "large": "large"})


@pytest.mark.parametrize("configuration", ["speceyes", "small"])  # agent turns: in speceyes
def test_the_graph_over_sglang_matches_the_transformers_path(
    demo_local, served, demo_queries_60, configuration
):
    served_run = run_configuration(served, configuration, demo_queries_60)
    assert_same(local_run(demo_local, configuration, demo_queries_60), served_run)


def test_the_server_says_what_it_serves(sglang_servers, demo_local):
    for role, server in sglang_servers.items():
        model = openai_chat_model(server.url, role, top_logprobs=64 if role == "small" else None)
        assert Path(model.served_root) == Path(server.model)  # from /model_info
        assert model.resize_spec == demo_local[role].resize_spec
        assert model.context_length == 4096


def test_the_end_of_turn_token_is_not_scored(served):
    raw = served["small"].invoke([SystemMessage("x"), HumanMessage("What colour?")], max_tokens=8)
    content = raw.response_metadata["logprobs"]["content"]
    assert content[-1]["token"] == "<|im_end|>" and len(content[-1]["top_logprobs"]) == 64
    scored = GateConfig().evaluate(raw.response_metadata["logprobs"])
    assert scored["tokens"] == [e["token"] for e in content[:-1]]
