import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import write_scene
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage

from helpers import judge
from speceyes_graph import GateConfig, LoopOptions, create_speceyes_graph
from speceyes_graph.gate.separability import answer_separability, answer_separability_from_logprobs
from speceyes_graph.messages import user_message
from speceyes_graph.models import ChatTransformersVLM, to_hf_messages

QUESTIONS = [
    "What colour is it?",
    "Is there a dog?",
    "Where is the square?",
    "How many objects?",
    "Read the sign.",
]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    d = tmp_path_factory.mktemp("scenes")
    return [
        write_scene(
            d / f"s{i}.png",
            size=(400 + 50 * i, 300),
            box=(20 * i, 10, 60 + 30 * i, 90),
            colour=(40 * i, 200 - 30 * i, 90),
        )
        for i in range(5)
    ]


def prompts(model, scenes, n=5):
    return [
        [
            SystemMessage(content="Answer briefly."),
            user_message(
                [scenes[i % len(scenes)]], QUESTIONS[i % 5] + "\nAnswer:", model.resize_spec
            ),
        ]
        for i in range(n)
    ]


def test_loads_through_from_pretrained(tiny_chat, tiny_models):
    small, large = tiny_chat["small"], tiny_chat["large"]
    assert type(small.hf_model).__name__ == "Qwen3VLForConditionalGeneration"
    assert type(large.hf_model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert small.resize_spec.factor == 32 and large.resize_spec.factor == 28
    assert large.processor.tokenizer.padding_side == "left"
    again = ChatTransformersVLM(model=str(tiny_models["large"]), max_new_tokens=3)
    assert torch.equal(again.hf_model.lm_head.weight, large.hf_model.lm_head.weight)


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no network"])
def test_a_hub_id_that_cannot_be_loaded_fails_before_transformers_retries(offline, monkeypatch):
    """Not cached, and offline (or the hub unreachable, as on this machine; or the id unknown,
    where there is a network): a clear OSError before transformers' download retries."""
    import transformers

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", never)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(OSError, match="nobody/no-such-model-xyz is not in the local cache"):
        ChatTransformersVLM(model="nobody/no-such-model-xyz")


def test_chat_template_renders_images_and_tool_turns(tiny_chat, scenes):
    msgs = [
        SystemMessage(content="sys"),
        user_message(scenes[:2], "two images", tiny_chat["large"].resize_spec),
        AIMessage(
            content="", tool_calls=[{"name": "zoom", "args": {"bbox": [1, 2, 3, 4]}, "id": "c1"}]
        ),
        ChatMessage(  # the tools' image turn (messages.to_wire, native): a user turn
            role="user",
            content=[
                {"type": "image_url", "image_url": {"url": "file://" + scenes[2]}},
                {"type": "text", "text": "crop"},
            ],
        ),
    ]
    hf, images = to_hf_messages(msgs)
    assert len(images) == 3 and hf[2]["tool_calls"][0]["function"]["name"] == "zoom"
    assert hf[3]["role"] == "user"
    proc = tiny_chat["large"].processor
    text = proc.apply_chat_template(hf, add_generation_prompt=True, tokenize=False)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 3
    assert '"name": "zoom"' in text and text.endswith("<|im_start|>assistant\n")


def test_logprobs_in_openai_format_agree_with_raw_logits(tiny_chat, scenes):
    small = tiny_chat["small"]
    msgs = prompts(small, scenes, 1)[0]
    reply = small.invoke(msgs)
    content = reply.response_metadata["logprobs"]["content"]
    assert 1 <= len(content) <= 6 and all(len(e["top_logprobs"]) == 16 for e in content)
    assert "".join(e["token"] for e in content) == reply.content
    first = content[0]
    assert first["logprob"] == pytest.approx(first["top_logprobs"][0]["logprob"])  # greedy = top-1
    # the same generation through HF directly, with raw logits
    prepared = small._prepare(msgs, None)
    with torch.inference_mode():
        out = small.hf_model.generate(
            **prepared["inputs"],
            max_new_tokens=len(content),
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    raw = torch.stack([step[0] for step in out.logits])
    assert answer_separability_from_logprobs(
        reply.response_metadata["logprobs"], 16
    ) == pytest.approx(answer_separability(raw, 16), rel=1e-4)


def test_batched_equals_unbatched(tiny_chat, tiny_models, scenes, monkeypatch):
    small = tiny_chat["small"]
    # the five are announced by batch() before its threads start, then prepared one by
    # one; on a loaded CI core that can take longer than the 0.5 s a batch waits for
    # announced requests (it did, once)
    monkeypatch.setattr(small.scheduler, "max_expect_s", 10.0)
    unbatched = ChatTransformersVLM(
        model=str(tiny_models["small"]), top_logprobs=16, max_new_tokens=6, max_batch_size=1
    )
    batch = prompts(small, scenes, 5)
    calls_before = small.scheduler.stats.calls
    together = small.batch(batch)
    assert small.scheduler.stats.calls - calls_before == 1  # one generate call for all five
    alone = [unbatched.invoke(m) for m in batch]
    assert len({m.content for m in alone}) > 1  # inputs matter: the comparison is not vacuous
    for a, b in zip(together, alone, strict=True):
        assert a.content == b.content
        la = [e["logprob"] for e in a.response_metadata["logprobs"]["content"]]
        lb = [e["logprob"] for e in b.response_metadata["logprobs"]["content"]]
        np.testing.assert_allclose(la, lb, atol=1e-4)


def test_32_threads_each_get_their_own_answer(tiny_chat, scenes):
    small = tiny_chat["small"]
    batch = prompts(small, scenes, 8)
    expected = [m.content for m in small.batch(batch)]
    barrier = threading.Barrier(32)
    calls_before = small.scheduler.stats.calls

    def worker(i):
        barrier.wait()
        return small.invoke(batch[i % 8]).content

    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(worker, range(32)))
    assert got == [expected[i % 8] for i in range(32)]
    assert small.scheduler.stats.calls - calls_before < 32  # coalesced


def test_a_broken_request_fails_only_its_caller(tiny_chat, scenes, tmp_path):
    small = tiny_chat["small"]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG garbage")
    good = prompts(small, scenes, 2)
    broken = [
        HumanMessage(
            content=[
                {"type": "image_url", "image_url": {"url": str(bad)}},
                {"type": "text", "text": "q"},
            ]
        )
    ]
    results = small.batch([good[0], broken, good[1]], return_exceptions=True)
    assert isinstance(results[0], AIMessage) and isinstance(results[2], AIMessage)
    assert "corrupt or truncated" in str(results[1])
    with pytest.raises(Exception, match="corrupt"):
        small.invoke(broken)


def test_tool_calls_are_parsed_from_text_when_tools_are_bound(tiny_chat):
    large = tiny_chat["large"]
    tok = large.processor.tokenizer
    text = '<think>look</think><tool_call>\n{"name": "zoom", "arguments": {"bbox": [1, 2, 30, 40]}}\n</tool_call>'
    ids = tok.encode(text) + [tok.convert_tokens_to_ids("<|im_end|>")]
    eos = {tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id}
    msg = large.generation.decode(0, ids, eos, (), None, tools=True)
    assert (
        msg.content == text
        and msg.tool_calls[0]["name"] == "zoom"
        and msg.tool_calls[0]["args"]["bbox"] == [1, 2, 30, 40]
    )
    assert msg.response_metadata["finish_reason"] == "stop"
    plain = large.generation.decode(0, ids, eos, (), None, tools=False)
    assert not plain.tool_calls  # without bound tools the text is left alone
    cut = large.generation.decode(0, ids, eos, ("</tool_call>",), None, tools=True)
    assert cut.content.endswith("}\n") and cut.tool_calls  # stop string removed, call still parsed


def test_bind_tools_renders_schemas_in_the_prompt(tiny_chat, scenes):
    from speceyes_tools import zoom

    large = tiny_chat["large"]
    bound = large.bind_tools([zoom])
    prepared = large._prepare(prompts(large, scenes, 1)[0], bound.kwargs["tools"])
    text = large.processor.tokenizer.decode(prepared["inputs"]["input_ids"][0])
    assert "<tools>" in text and '"name": "zoom"' in text and "bbox" in text
    assert isinstance(bound.invoke(prompts(large, scenes, 1)[0]), AIMessage)


def test_async_callers_are_batched(tiny_chat, scenes):
    import asyncio

    small = tiny_chat["small"]
    batch = prompts(small, scenes, 4)
    expected = [m.content for m in small.batch(batch)]

    async def main():
        return await asyncio.gather(*(small.ainvoke(m) for m in batch))

    assert [m.content for m in asyncio.run(main())] == expected


@pytest.mark.parametrize("mode", ["speceyes", "agent", "small"])
def test_full_graph_on_tiny_models(tiny_chat, scenes, mode):
    small, large = tiny_chat["small"], tiny_chat["large"]
    g = create_speceyes_graph(
        judge=large,
        speculator=small,
        agent=large,
        mode=mode,
        gate=GateConfig(k=16),
        loop=LoopOptions(max_steps=2),
    ).compile()
    outs = g.batch(
        [
            {"question": q, "images": [s], "options": ["red", "blue"]}
            for q, s in zip(QUESTIONS, scenes, strict=True)
        ]
    )
    for out in outs:
        assert out.get("error") is None, out.get("error")
        assert (
            out["route"]
            in {
                "speceyes": {"speculative", "judged-agentic", "rejected-agentic"},
                "agent": {"agent-only"},
                "small": {"draft-only"},
            }[mode]
        )
        if mode != "agent" and out.get("draft"):
            assert len(out["draft"]["top_logprobs"][0]) == 16
        if out["route"] in ("judged-agentic", "rejected-agentic", "agent-only"):
            assert 1 <= len(out["agent_steps"]) <= 2 and out["stop_reason"]


@pytest.mark.parametrize("tau, route", [(0.0, "speculative"), (1.0, "rejected-agentic")])
def test_real_models_follow_the_gate(tiny_chat, scenes, tau, route):
    g = create_speceyes_graph(
        judge=judge("no"),
        speculator=tiny_chat["small"],
        agent=tiny_chat["large"],
        gate=GateConfig(k=16, tau=tau),
        loop=LoopOptions(max_steps=2),
    ).compile()
    out = g.invoke({"question": "What colour?", "images": [scenes[0]]})
    assert out["route"] == route and out.get("error") is None
    if route == "speculative":
        assert out["answer"] == out["draft"]["text"]
    else:
        assert len(out["agent_steps"]) >= 1


def test_log_probs_with_a_stop_string_that_cuts_the_reply(tiny_chat):
    """A small model's tool-loop turn (depth-D speculation) asks for top-K log-probs and stop
    strings at once: the cut keeps the log-probs of the tokens before the stop string."""
    from langchain_core.messages import HumanMessage

    small = tiny_chat["small"]
    messages = [HumanMessage("What is the color of the object?")]
    full = small.invoke(messages)
    content = full.response_metadata["logprobs"]["content"]
    visible = [e["token"] for e in content if e["token"].strip()]
    assert len(visible) >= 2, content
    stop = visible[1]
    cut = small.invoke(messages, stop=[stop])
    kept = cut.response_metadata["logprobs"]["content"]
    assert cut.response_metadata["finish_reason"] == "stop"
    assert stop not in cut.content and len(kept) < len(content)
    assert all(len(e["top_logprobs"]) == 16 for e in kept)
    assert [e["token"] for e in kept] == [e["token"] for e in content[: len(kept)]]
