"""A Hugging Face model whose ``generate`` replies with scripted text: ChatTransformersVLM's
real plumbing (chat template, processor, batching, decoding, stop strings, log-probs, tool-call
parsing, streaming) around replies a tiny random model could never write."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from speceyes_graph.models import ChatTransformersVLM


class ScriptedGenerate:
    """``respond(prompt_text) -> reply_text``; the reply is tokenized with the real tokenizer
    and returned token by token (to a streamer too), ending with ``<|im_end|>``."""

    def __init__(self, tokenizer, respond: Callable[[str], str], delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.respond = respond
        self.delay_s = delay_s  # per generated token, to make a generation observably slow
        self.prompts: list[str] = []
        self.device = torch.device("cpu")
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.generation_config = SimpleNamespace(eos_token_id=self.eos)
        self.config = SimpleNamespace(max_position_embeddings=4096)

    def generate(self, input_ids, attention_mask=None, *, max_new_tokens, pad_token_id,
                 streamer=None, output_logits=False, **_):  # fmt: skip
        delay_s = (
            self.delay_s
        )  # as set when this generation started (a later change is for later ones)
        replies = []
        for row, mask in zip(input_ids, attention_mask, strict=True):
            prompt = self.tokenizer.decode(row[mask.bool()], skip_special_tokens=False)
            self.prompts.append(prompt)
            ids = self.tokenizer.encode(self.respond(prompt), add_special_tokens=False)
            replies.append((ids + [self.eos])[:max_new_tokens])
        width = max(len(r) for r in replies)
        generated = torch.full((len(replies), width), pad_token_id, dtype=input_ids.dtype)
        for i, r in enumerate(replies):
            generated[i, : len(r)] = torch.tensor(r)
        if streamer is not None:
            streamer.put(input_ids)
            for step in range(width):
                time.sleep(delay_s)
                streamer.put(generated[:, step])
            streamer.end()
        elif delay_s:
            time.sleep(delay_s * width)
        logits = None
        if output_logits:  # the chosen token far ahead of a flat rest
            vocab = len(self.tokenizer)
            logits = []
            for step in range(width):
                step_logits = torch.zeros((len(replies), vocab))
                step_logits[torch.arange(len(replies)), generated[:, step]] = 12.0
                logits.append(step_logits)
        return SimpleNamespace(sequences=torch.cat([input_ids, generated], dim=1), logits=logits)


def scripted_chat_model(processor, respond, delay_s: float = 0.0, **kwargs) -> ChatTransformersVLM:
    """A ChatTransformersVLM over a real processor and a scripted generate."""
    fake = ScriptedGenerate(processor.tokenizer, respond, delay_s)
    model = ChatTransformersVLM.from_components(fake, processor, model="scripted", **kwargs)
    return model
