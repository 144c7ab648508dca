"""Tiny random checkpoints of ten image-text-to-text families, built offline.

``make_tiny_family(family, out)`` writes a folder that ``AutoProcessor.from_pretrained(out)`` and
``AutoModelForImageTextToText.from_pretrained(out)`` load exactly as they would load the real
instruct checkpoint of that family: the real configuration, model, image processor, processor
and (as near as transformers 5 allows) tokenizer classes, the real chat template and the real
special tokens, but a vocabulary of about a thousand byte-level or byte-fallback BPE pieces
trained here and a few hundred thousand random weights.

Why: code that claims to work with "any image-text-to-text checkpoint" breaks on what differs
between families -- how many placeholder tokens an image expands to, whether images are tiled,
whether the tokenizer adds a BOS token that the chat template also writes, what ends a turn --
and none of that can be tested against Qwen alone or downloaded in a sandbox. The processors'
behaviour is what these fixtures are faithful to; the weights are noise, initialised with a
large standard deviation so that greedy decoding depends on the input instead of repeating one
token.

Families (``FAMILIES``) and the checkpoint each imitates:

==================  ==================================================  =======================
family              imitates                                            tokenizer adds BOS
==================  ==================================================  =======================
qwen2.5-vl          Qwen/Qwen2.5-VL-*-Instruct (``demo.tiny``)          no
qwen3-vl            Qwen/Qwen3-VL-*-Instruct (``demo.tiny``)            no
idefics3            HuggingFaceM4/Idefics3-8B-Llama3                    yes, ``<|begin_of_text|>``
smolvlm             HuggingFaceTB/SmolVLM2-2.2B-Instruct                no
llava-onevision     llava-hf/llava-onevision-qwen2-0.5b-ov-hf           no
gemma3              google/gemma-3-4b-it                                yes, ``<bos>``
internvl            OpenGVLab/InternVL3-1B-hf                           no
mistral3            mistralai/Mistral-Small-3.1-24B-Instruct-2503       yes, ``<s>``
paligemma           google/paligemma-3b-mix-224                         processor inserts ``<bos>``
llava-next          llava-hf/llava-v1.6-mistral-7b-hf                   yes, ``<s>``
==================  ==================================================  =======================

Quirks the fixtures keep, because the real checkpoints have them:

- Idefics3, Gemma 3 and Mistral 3 templates write the BOS token and their tokenizers add it
  too: ``processor.apply_chat_template(..., tokenize=True)`` gives one BOS, but rendering the
  template and then calling ``processor(text=...)`` gives two.
- PaliGemma has no chat template (pass ``PALIGEMMA_CHAT_TEMPLATE``); its processor turns the
  tokenizer's BOS off on every load and inserts ``<bos>`` after the image tokens.
- SmolVLMProcessor needs the ``num2words`` package to load (it spells video frame counts),
  as the real checkpoint does.
- Gemma 3's and Mistral 3.1's templates reject a ``tool`` role; LLaVA-NeXT's accepts only
  user/assistant/system.

Deviations, for a tiny random model to be useful: Gemma 3's head is untied from its
embeddings, and weight matrices a model initialises to zero are randomised.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from speceyes_graph.demo.tiny import (
    _CORPUS_LINES,
    ADDED_TOKENS,
    QWEN_CHAT_TEMPLATE,
    TINY_ARCH,
    _processor,
    _quiet_save,
    build_qwen_vl,
    build_tokenizer,
)

__all__ = [
    "CHAT_TEMPLATES",
    "FAMILIES",
    "PALIGEMMA_CHAT_TEMPLATE",
    "make_tiny_family",
]

FAMILIES: tuple[str, ...] = (
    "qwen2.5-vl",
    "qwen3-vl",
    "idefics3",
    "smolvlm",
    "llava-onevision",
    "gemma3",
    "internvl",
    "mistral3",
    "paligemma",
    "llava-next",
)

# ----------------------------------------------------------------------------------------------
# Chat templates, verbatim as each instruct checkpoint ships them (whitespace included, since
# the rendered prompt is what the model sees).
# ----------------------------------------------------------------------------------------------

# HuggingFaceM4/Idefics3-8B-Llama3, processor chat template (also quoted by Idefics3 fine-tuning
# code and ModernVBert's DEFAULT_CHAT_TEMPLATE). Starts with the literal BOS that the Llama 3
# tokenizer also adds: the processor's own ``apply_chat_template(tokenize=True)`` then turns
# ``add_special_tokens`` off, a plain ``processor(text=...)`` call does not.
_IDEFICS3_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}{{message['role'].capitalize()}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# HuggingFaceTB/SmolVLM2-2.2B-Instruct, chat_template.json (the same string transformers keeps
# as DEFAULT_CHAT_TEMPLATE in models/smolvlm/processing_smolvlm.py, before its later string-
# content branch). ``<|im_start|>`` is also this tokenizer's bos_token; it is written once.
_SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}"
    "{{ '<video>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# llava-hf/llava-onevision-qwen2-*-ov-hf, from transformers'
# models/llava_onevision/convert_llava_onevision_weights_to_hf.py (images, then videos, then
# text, whatever order the parts come in; no default system prompt).
_LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# google/gemma-3-*-it, chat_template.json; the same text is _CHAT_TEMPLATE in transformers'
# models/gemma3/convert_gemma3_weights.py. Starts with {{ bos_token }} (the tokenizer also adds
# <bos>); roles must alternate user/assistant, so a "tool" turn raises as with the real one.
_GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# OpenGVLab/InternVL3-*-hf, from transformers' models/internvl/convert_internvl_weights_to_hf.py
# (the converted checkpoints write the <IMG_CONTEXT> placeholder that the processor expands into
# <img><IMG_CONTEXT>...</img>; no default system prompt in the -hf template).
_INTERNVL_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}"
    "{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\n' }}"
    "{% endif %}"
)

# mistralai/Mistral-Small-3.1-24B-Instruct-2503, chat_template.json of the transformers-format
# files (as quoted in public code that injects it; its default system prompt still names
# "Mistral Small 3" and carries today's date, rendered with strftime_now). Starts with
# {{- bos_token }} (the tokenizer also adds <s>); "tool" turns raise, as with the real one.
_MISTRAL3_DEFAULT_SYSTEM = (
    "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French "
    "startup headquartered in Paris.\\nYour knowledge base was last updated on 2023-10-01. The "
    'current date is " + today + ".\\n\\nWhen you\'re not sure about some information, you say '
    "that you don't have the information and don't make up anything.\\nIf the user's question is "
    "not clear, ambiguous, or does not provide enough context for you to accurately answer the "
    "question, you do not try to answer it right away and you rather ask the user to clarify "
    'their request (e.g. \\"What are some good restaurants around me?\\" => \\"Where are you?\\" '
    'or \\"When is the next flight to Tokyo\\" => \\"Where do you travel from?\\")'
)
_MISTRAL3_TEMPLATE = (
    '{%- set today = strftime_now("%Y-%m-%d") %}'
    '{%- set default_system_message = "' + _MISTRAL3_DEFAULT_SYSTEM + '" %}'
    "\n\n{{- bos_token }}\n\n"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- if messages[0]['content'] is string %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- else %}"
    "{%- set system_message = messages[0]['content'][0]['text'] %}"
    "{%- endif %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = default_system_message %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n\n"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if message['content'] is string %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else %}"
    "{{- '[INST]' }}"
    "{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}"
    "{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] %}"
    "{{- '[IMG]' }}"
    "{%- else %}"
    "{{- raise_exception('Only text and image blocks are supported in message content!') }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- '[/INST]' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'system' %}"
    "{%- if message['content'] is string %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- else %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] + eos_token }}"
    "{%- else %}"
    "{{- message['content'][0]['text'] + eos_token }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- raise_exception('Only user, system and assistant roles are supported!') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# llava-hf/llava-v1.6-mistral-7b-hf, chat_template.json (current revision, which closes
# assistant turns with '</s> '; an older one wrote a literal '<\\s> '). No BOS in the template:
# the Llama/Mistral tokenizer adds <s>.
_LLAVA_NEXT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<<SYS>>\n' + message['content'][0]['text'] + '\n<</SYS>>\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' }}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{{' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'][0]['text'] + '</s> '}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

CHAT_TEMPLATES: dict[str, str] = {
    "qwen2.5-vl": QWEN_CHAT_TEMPLATE,
    "qwen3-vl": QWEN_CHAT_TEMPLATE,
    "idefics3": _IDEFICS3_TEMPLATE,
    "smolvlm": _SMOLVLM_TEMPLATE,
    "llava-onevision": _LLAVA_ONEVISION_TEMPLATE,
    "gemma3": _GEMMA3_TEMPLATE,
    "internvl": _INTERNVL_TEMPLATE,
    "mistral3": _MISTRAL3_TEMPLATE,
    # PaliGemma checkpoints ship no chat template; see PALIGEMMA_CHAT_TEMPLATE.
    "llava-next": _LLAVA_NEXT_TEMPLATE,
}
"""The chat template saved with each family's checkpoint (PaliGemma saves none)."""

PALIGEMMA_CHAT_TEMPLATE: str = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is not string -%}"
    "{%- for part in message['content'] if part['type'] == 'image' -%}<image>{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if not loop.last %}\n{% endif -%}"
    "{%- endfor -%}"
)
"""A chat template a user would pass for PaliGemma, which ships none (it is a prefix-LM).

It writes every image first, as ``<image>`` (the processor expands each to ``image_seq_length``
tokens and inserts ``<bos>`` after the last one), then the text of every turn, one line each;
the processor appends the ``\\n`` that separates PaliGemma's prefix from its answer, so
``add_generation_prompt`` has nothing to add.
"""

# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------

# Words the templates and prompts of the families use, so they tokenize into few pieces.
_FAMILY_CORPUS = (
    "User: Assistant: System: Tool: user assistant system model tool",
    "<start_of_turn>user\n<end_of_turn>\n<start_of_turn>model\n",
    "[INST] What is shown in this image? [/INST] The image shows a radar chart.",
    "<<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\n",
    "Mistral Small 3 Large Language Model created by Mistral AI, a French startup in Paris.",
    "Your knowledge base was last updated on 2023-10-01. The current date is 2025-03-17.",
    "answer en What is on the image? caption en detect cat ; segment dog",
    "Frame from 00:01: You are provided the following series of frames from a video.",
)

# The pre-tokenizer regexes of the real byte-level vocabularies.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_BYTE_FALLBACK = tuple(f"<0x{b:02X}>" for b in range(256))


def _corpus() -> list[str]:
    """Training text: tiny.py's lines plus the families' own words, repeated so every piece
    clears the trainer's ``min_frequency``."""
    return [line for _ in range(4) for line in (*_CORPUS_LINES, *_FAMILY_CORPUS)]


def _train_bpe(pre_tokenizer: Any, normalizer: Any, alphabet: Sequence[str], size: int) -> Any:
    """Train a BPE model on the corpus under the given pipeline; returns (pieces, merges)."""
    from tokenizers import Tokenizer, models, trainers

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizer
    bpe.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        min_frequency=2,
        initial_alphabet=list(alphabet),
        show_progress=False,
        special_tokens=[],
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return pieces, merges


def _byte_level_bpe(
    regex: str,
    head: Sequence[str],
    tail: Sequence[str],
    *,
    split_digits: bool = False,
    size: int = 768,
) -> Any:
    """A byte-level BPE (GPT-2 / Llama 3 / Tekken style) as a ``tokenizers.Tokenizer``.

    ``head`` tokens get the lowest ids (SmolLM2's and Tekken's control tokens come first),
    ``tail`` tokens follow the learned pieces (Llama 3's come last). Every byte is in the
    alphabet, so any string encodes and ``decode(encode(s)) == s``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    pre = pre_tokenizers.Sequence(
        [
            *steps,
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    pieces, merges = _train_bpe(pre, None, pre_tokenizers.ByteLevel.alphabet(), size)
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*head, *pieces, *tail]))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(head: Sequence[str], *, size: int = 768) -> tuple[dict[str, int], list]:
    """Vocabulary and merges of a SentencePiece-style BPE (Llama 2 / Mistral / Gemma).

    Pieces carry ``▁`` for spaces and the 256 ``<0xNN>`` byte tokens follow ``head`` (as in
    the real vocabularies), so with ``byte_fallback`` any string encodes and decodes intact.
    Trained word by word; the family's tokenizer class supplies its own pipeline on top.
    """
    from tokenizers import normalizers, pre_tokenizers

    pieces, merges = _train_bpe(
        pre_tokenizers.Split("▁", behavior="merged_with_next"),
        normalizers.Replace(" ", "▁"),
        (),
        size,
    )
    ordered = dict.fromkeys([*head, *_BYTE_FALLBACK, *pieces])
    return {t: i for i, t in enumerate(ordered)}, merges


def _finish(tok: Any, specials: Sequence[str], chat_template: str | None) -> Any:
    """Mark the family's control tokens special (never split, skipped by
    ``skip_special_tokens``), add the agent-protocol tags as plain added tokens (single tokens
    that decode intact), and set the chat template and left padding."""
    from transformers import AddedToken

    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(t, special=True, normalized=False) for t in specials
            ]
        },
        replace_extra_special_tokens=False,
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.padding_side = "left"
    tok.chat_template = chat_template
    return tok


def _backend(tok: Any, **kwargs: Any) -> Any:
    """Wrap a ``tokenizers.Tokenizer`` as transformers 5's ``TokenizersBackend`` (the class
    ``PreTrainedTokenizerFast`` now names), which saves and reloads its tokenizer.json as is."""
    from transformers import TokenizersBackend

    return TokenizersBackend(tokenizer_object=tok, padding_side="left", **kwargs)


def _llama3_tokenizer(template: str) -> Any:
    """Idefics3-8B-Llama3's tokenizer: Llama 3's byte-level BPE with its reserved tokens last,
    loaded as ``PreTrainedTokenizerFast`` and adding ``<|begin_of_text|>`` on encode."""
    named = ("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|eot_id|>")
    image = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    grid = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    specials = (*named, *image, *grid)
    tok = _byte_level_bpe(_LLAMA3_REGEX, (), specials)
    tok = _backend(
        tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|finetune_right_pad_id|>",
        add_bos_token=True,
        model_max_length=131072,
    )
    return _finish(tok, specials, template)


def _smollm2_tokenizer(template: str) -> Any:
    """SmolVLM2's tokenizer: SmolLM2's byte-level BPE with its control tokens first; bos is
    ``<|im_start|>`` but nothing is added on encode (GPT2Tokenizer on the Hub, loaded as
    ``TokenizersBackend`` by transformers 5)."""
    head = (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<repo_name>",
        "<reponame>",
        "<file_sep>",
        "<filename>",
        "<gh_stars>",
        "<issue_start>",
        "<issue_comment>",
        "<issue_closed>",
        "<jupyter_start>",
        "<jupyter_text>",
        "<jupyter_code>",
        "<jupyter_output>",
        "<jupyter_script>",
        "<empty_output>",
    )
    image = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
    grid = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    tail = (*image, "<video>", *grid)
    tok = _byte_level_bpe(_GPT2_REGEX, head, tail, split_digits=True)  # SmolLM2 splits digits
    tok = _backend(
        tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=8192,
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "end_of_utterance_token": "<end_of_utterance>",
            "global_image_token": "<global-img>",
            "video_token": "<video>",
        },
    )
    return _finish(tok, (*head[:3], *tail), template)


def _tekken_tokenizer(template: str) -> Any:
    """Mistral Small 3.1's Tekken tokenizer: byte-level BPE whose control tokens take the
    first ids (``[IMG]`` is 10 as in the real one), adding ``<s>`` on encode."""
    head = (
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[TOOL_CALLS]",
        "[IMG]",
        "<pad>",
        "[IMG_BREAK]",
        "[IMG_END]",
        "[PREFIX]",
        "[MIDDLE]",
        "[SUFFIX]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CONTENT]",
    )
    tok = _byte_level_bpe(_TEKKEN_REGEX, head, ())
    tok = _backend(
        tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        model_max_length=131072,
    )
    return _finish(tok, head, template)


# Gemma's first ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4, [@BOS@] 5.
_GEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[@BOS@]")


def _gemma_tokenizer(
    head: Sequence[str], specials: Sequence[str], template: str | None, **kw: Any
) -> Any:
    """A ``GemmaTokenizer`` (SentencePiece-style BPE with byte fallback) adding ``<bos>``.

    transformers 5 rebuilds GemmaTokenizer from vocab + merges on load with this same
    pipeline, keeping the saved post-processor, so what is saved is what loads.
    """
    from transformers import GemmaTokenizer

    vocab, merges = _sentencepiece_bpe(head)
    tok = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        add_bos_token=True,
        add_eos_token=False,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        **kw,
    )
    return _finish(tok, specials, template)


def _gemma3_tokenizer(template: str) -> Any:
    """Gemma 3's tokenizer with its turn and image tokens (boi/eoi/image named as the real
    tokenizer_config's ``extra_special_tokens`` name them, which Gemma3Processor reads)."""
    turns = ("<start_of_turn>", "<end_of_turn>")
    image = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
    return _gemma_tokenizer(
        (*_GEMMA_HEAD, *turns, *image),
        (*turns, *image),
        template,
        model_max_length=131072,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )


def _paligemma_tokenizer() -> Any:
    """PaliGemma's Gemma tokenizer with ``<image>``; PaliGemmaProcessor adds the 1024
    ``<locNNNN>`` and 128 ``<segNNN>`` tokens itself and turns the BOS off, inserting it
    after the image tokens instead."""
    return _gemma_tokenizer((*_GEMMA_HEAD, "<image>"), ("<image>",), None, model_max_length=1000000)


def _llama2_tokenizer(template: str) -> Any:
    """llava-v1.6-mistral's tokenizer: Mistral 7B's SentencePiece BPE (``<unk>``, ``<s>``,
    ``</s>``, then the byte tokens, as ids 0-258), with ``<image>`` and ``<pad>`` appended.

    Built as ``LlamaTokenizer`` (its Hub class); transformers 5 loads llava_next's tokenizer as
    ``TokenizersBackend`` from the saved tokenizer.json, so the pipeline round-trips.
    """
    from transformers import LlamaTokenizer

    vocab, merges = _sentencepiece_bpe(("<unk>", "<s>", "</s>"))
    for extra in ("<image>", "<pad>"):
        vocab[extra] = len(vocab)
    tok = LlamaTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        add_bos_token=True,
        add_eos_token=False,
        legacy=False,
        padding_side="left",
        model_max_length=32768,
    )
    return _finish(tok, ("<image>", "<pad>"), template)


def _qwen2_tokenizer(template: str, specials: Sequence[str], extra: dict[str, str]) -> Any:
    """A Qwen2 tokenizer (tiny.py's, no BOS) with the family's image tokens added."""
    import tempfile

    from transformers import Qwen2Tokenizer

    tok = build_tokenizer()
    # the image tokens first (their ids in this order), then named (``tokenizer.image_token``
    # ...) the way the real conversions name them: by reloading with ``extra_special_tokens``
    tok.add_special_tokens(
        {"additional_special_tokens": list(specials)}, replace_extra_special_tokens=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        tok = Qwen2Tokenizer.from_pretrained(tmp, extra_special_tokens=extra)
    return _finish(tok, specials, template)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

_INIT_STD = 0.3  # large on purpose: with 0.02 greedy decoding repeats one token whatever the input

# One tiny decoder for every family: head_dim 16.
_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "initializer_range": _INIT_STD,
}
# One tiny vision transformer (the families' towers differ in kind, not here in size).
_VISION: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "initializer_range": _INIT_STD,
}


def _generation_config(tok: Any, eos: Sequence[str]) -> Any:
    """Greedy decoding that stops at the family's end-of-turn token(s), padding with pad."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.convert_tokens_to_ids(t) for t in eos],
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )


def _randomize_zero_matrices(model: Any) -> None:
    """Give random values to the weight matrices a model initialises to zero.

    Some are zero only until training (Gemma 3's image projection, InternViT's position
    embeddings and class token); left at zero, the image would not reach the text at all.
    Norm weights and biases (1-D) keep their initial values.
    """
    import torch

    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and not param.any():
                param.normal_(0.0, _INIT_STD)


def _save(model: Any, processor: Any, tok: Any, eos: Sequence[str], out: Path) -> None:
    """Write model (with a greedy generation config stopping at ``eos``) and processor."""
    _randomize_zero_matrices(model)
    model.generation_config = _generation_config(tok, eos)
    _quiet_save(model.eval(), out)
    processor.save_pretrained(out)


def _text_config(tok: Any, **overrides: Any) -> dict[str, Any]:
    """The tiny decoder's config, its vocabulary and special ids taken from ``tok``."""
    return {
        **_TEXT,
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **overrides,
    }


# Every vision tower uses 8 px patches; tiles are 32 px (4x4 patches) or 48 px (6x6).
_PATCH = 8


def _build_qwen(kind: str, out: Path) -> None:
    """tiny.py's Qwen-VL builds ("large" is Qwen2.5-VL, "small" Qwen3-VL), one per folder."""
    tok = build_tokenizer()
    model = build_qwen_vl(kind, tok, *TINY_ARCH[kind], init_std=_INIT_STD)
    budgets = {"large": (56 * 56, 112 * 112 * 4), "small": (64 * 64, 112 * 112 * 4 * 256 // 196)}
    _quiet_save(model, out)
    _processor(kind, tok, *budgets[kind]).save_pretrained(out)


def _build_idefics3(out: Path) -> None:
    """Idefics3: 32 px tiles of 4x4 patches, pixel-shuffled by 2 into 4 tokens each; images
    are upscaled to a 128 px longest edge and split into up to 4x4 tiles plus a global view
    (the real ratios: 1456 / 364 px)."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    tile, scale = 32, 2
    tok = _llama3_tokenizer(_IDEFICS3_TEMPLATE)
    image_seq_len = (tile // _PATCH) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessor(
            size={"longest_edge": 4 * tile},
            max_image_size={"longest_edge": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        ),
        tokenizer=tok,
        image_seq_len=image_seq_len,
        chat_template=_IDEFICS3_TEMPLATE,
    )
    config = Idefics3Config(
        vision_config={**_VISION, "image_size": tile, "patch_size": _PATCH},
        text_config={"model_type": "llama", **_text_config(tok), "rope_theta": 500000.0},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = Idefics3ForConditionalGeneration(config)
    _save(model, processor, tok, ("<end_of_utterance>", "<|end_of_text|>"), out)


def _build_smolvlm(out: Path) -> None:
    """SmolVLM2: 48 px tiles of 6x6 patches, pixel-shuffled by 3 into 4 tokens each (the
    2.2B's scale factor), split from a 192 px longest edge (the real 1536 / 384 px)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    tile, scale = 48, 3
    tok = _smollm2_tokenizer(_SMOLVLM_TEMPLATE)
    image_seq_len = (tile // _PATCH) ** 2 // scale**2
    image_processor = SmolVLMImageProcessor(
        size={"longest_edge": 4 * tile},
        max_image_size={"longest_edge": tile},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    video_processor = SmolVLMVideoProcessor(
        size={"longest_edge": tile}, max_image_size={"longest_edge": tile}
    )
    processor = SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        image_seq_len=image_seq_len,
        chat_template=_SMOLVLM_TEMPLATE,
    )
    config = SmolVLMConfig(
        vision_config={**_VISION, "image_size": tile, "patch_size": _PATCH},
        text_config={"model_type": "llama", **_text_config(tok), "rope_theta": 130000.0},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = SmolVLMForConditionalGeneration(config)
    _save(model, processor, tok, ("<end_of_utterance>",), out)


def _pinpoints(tile: int, n: int) -> list[list[int]]:
    return [[tile * i, tile * j] for i in range(1, n + 1) for j in range(1, n + 1)]


def _build_llava_onevision(out: Path) -> None:
    """LLaVA-OneVision: SigLIP on 32 px tiles (16 tokens, all kept), anyres over a 6x6 grid of
    tiles with the anyres_max_9 downsampling, base features only for multi-image prompts."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tile = 32
    tok = _qwen2_tokenizer(
        _LLAVA_ONEVISION_TEMPLATE,
        ("<image>", "<video>"),
        {"image_token": "<image>", "video_token": "<video>"},
    )
    pinpoints = _pinpoints(tile, 6)
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(
            size={"height": tile, "width": tile},
            image_grid_pinpoints=pinpoints,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
        ),
        tokenizer=tok,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": tile, "width": tile}),
        num_image_tokens=(tile // _PATCH) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=_LLAVA_ONEVISION_TEMPLATE,
    )
    config = LlavaOnevisionConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "vision_use_head": False,
        },
        text_config={"model_type": "qwen2", **_text_config(tok)},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=True,
    )
    model = LlavaOnevisionForConditionalGeneration(config)
    _save(model, processor, tok, ("<|im_end|>", "<|endoftext|>"), out)


def _build_gemma3(out: Path) -> None:
    """Gemma 3: SigLIP on a fixed 32 px square (4x4 patches), average-pooled to 2x2 = 4 soft
    tokens between <start_of_image> and <end_of_image>; pan-and-scan off (its default)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    tile, tokens = 32, 4
    tok = _gemma3_tokenizer(_GEMMA3_TEMPLATE)
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(
            size={"height": tile, "width": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            do_pan_and_scan=None,
        ),
        tokenizer=tok,
        image_seq_length=tokens,
        chat_template=_GEMMA3_TEMPLATE,
    )
    config = Gemma3Config(
        text_config={
            **_text_config(tok),
            "tie_word_embeddings": False,
            "query_pre_attn_scalar": _TEXT["head_dim"],
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "vision_use_head": False,
        },
        mm_tokens_per_image=tokens,
        # untied (the real one ties): with a tiny model, Gemma's sqrt(hidden) embedding scale
        # and a tied head make every position predict its own input token
        tie_word_embeddings=False,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
        initializer_range=_INIT_STD,
    )
    model = Gemma3ForConditionalGeneration(config)
    _save(model, processor, tok, ("<eos>", "<end_of_turn>"), out)


def _build_internvl(out: Path) -> None:
    """InternVL3: 32 px tiles of 4x4 patches, pixel-shuffled by 0.5 into 4 <IMG_CONTEXT>
    tokens each; crop_to_patches splits an image into 1-12 tiles plus a thumbnail."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    tile = 32
    names = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    extra = ("<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>")
    tok = _qwen2_tokenizer(_INTERNVL_TEMPLATE, (*extra, "<box>", "</box>", "<video>"), names)
    image_seq_length = (tile // _PATCH) ** 2 // 4
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size={"height": tile, "width": tile},
            crop_to_patches=False,  # as saved on the Hub; InternVLProcessor turns it on per call
            min_patches=1,
            max_patches=12,
            image_mean=[0.485, 0.456, 0.406],
            image_std=[0.229, 0.224, 0.225],
        ),
        tokenizer=tok,
        video_processor=InternVLVideoProcessor(size={"height": tile, "width": tile}),
        image_seq_length=image_seq_length,
        chat_template=_INTERNVL_TEMPLATE,
    )
    config = InternVLConfig(
        vision_config={
            **_VISION,
            "image_size": [tile, tile],
            "patch_size": [_PATCH, _PATCH],
            "use_absolute_position_embeddings": True,
        },
        text_config={"model_type": "qwen2", **_text_config(tok)},
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=image_seq_length,
        downsample_ratio=0.5,
        tie_word_embeddings=True,
    )
    model = InternVLForConditionalGeneration(config)
    _save(model, processor, tok, ("<|im_end|>", "<|endoftext|>"), out)


def _build_mistral3(out: Path) -> None:
    """Mistral Small 3.1: Pixtral keeps the aspect ratio, shrinks to a 64 px longest edge and
    rounds up to 16 px (8 px patches merged 2x2), one [IMG] per merged patch, [IMG_BREAK]
    after each row and [IMG_END] last."""
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralImageProcessor,
        PixtralProcessor,
    )

    longest, merge = 64, 2
    tok = _tekken_tokenizer(_MISTRAL3_TEMPLATE)
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": longest},
            patch_size={"height": _PATCH, "width": _PATCH},
        ),
        tokenizer=tok,
        patch_size=_PATCH,
        spatial_merge_size=merge,
        chat_template=_MISTRAL3_TEMPLATE,
    )
    config = Mistral3Config(
        vision_config={
            "model_type": "pixtral",
            **_VISION,
            "head_dim": _VISION["hidden_size"] // _VISION["num_attention_heads"],
            "image_size": longest,
            "patch_size": _PATCH,
        },
        text_config={"model_type": "mistral", **_text_config(tok), "sliding_window": None},
        image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=merge,
        tie_word_embeddings=False,
    )
    model = Mistral3ForConditionalGeneration(config)
    _save(model, processor, tok, ("</s>",), out)


def _build_paligemma(out: Path) -> None:
    """PaliGemma: SigLIP on a fixed 32 px square, 16 <image> tokens; no chat template."""
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
    )

    tile = 32
    tok = _paligemma_tokenizer()
    tokens = (tile // _PATCH) ** 2
    processor = PaliGemmaProcessor(
        image_processor=SiglipImageProcessor(
            size={"height": tile, "width": tile},
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            image_seq_length=tokens,
        ),
        tokenizer=tok,
    )
    hidden = _TEXT["hidden_size"]
    config = PaliGemmaConfig(
        vision_config={
            "model_type": "siglip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "projection_dim": hidden,
            "vision_use_head": False,
        },
        text_config={"model_type": "gemma", **_text_config(tok)},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vocab_size=len(tok),
        projection_dim=hidden,
        hidden_size=hidden,
        tie_word_embeddings=True,
    )
    model = PaliGemmaForConditionalGeneration(config)
    # The processor switched the tokenizer's BOS off (it inserts <bos> itself, after the image
    # tokens, and does so again on every load); the Hub tokenizer adds it when used alone.
    tok.add_bos_token = True
    _save(model, processor, tok, ("<eos>",), out)


def _build_llava_next(out: Path) -> None:
    """LLaVA-NeXT: CLIP on 32 px tiles (16 patches + CLS, the CLS dropped), anyres over the
    real pinpoints' shapes (1x2, 2x1, 2x2, 3x1, 1x3 tiles), unpadded, with a newline column."""
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tile = 32
    tok = _llama2_tokenizer(_LLAVA_NEXT_TEMPLATE)
    pinpoints = [[tile * h, tile * w] for h, w in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(
            size={"shortest_edge": tile},
            crop_size={"height": tile, "width": tile},
            image_grid_pinpoints=pinpoints,
        ),
        tokenizer=tok,
        patch_size=_PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=_LLAVA_NEXT_TEMPLATE,
    )
    config = LlavaNextConfig(
        vision_config={
            "model_type": "clip_vision_model",
            **_VISION,
            "image_size": tile,
            "patch_size": _PATCH,
            "projection_dim": _TEXT["hidden_size"],
        },
        text_config={"model_type": "mistral", **_text_config(tok), "sliding_window": None},
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=(tile // _PATCH) ** 2,
        tie_word_embeddings=False,
    )
    model = LlavaNextForConditionalGeneration(config)
    _save(model, processor, tok, ("</s>",), out)


_BUILDERS: dict[str, Callable[[Path], None]] = {
    "qwen2.5-vl": lambda out: _build_qwen("large", out),
    "qwen3-vl": lambda out: _build_qwen("small", out),
    "idefics3": _build_idefics3,
    "smolvlm": _build_smolvlm,
    "llava-onevision": _build_llava_onevision,
    "gemma3": _build_gemma3,
    "internvl": _build_internvl,
    "mistral3": _build_mistral3,
    "paligemma": _build_paligemma,
    "llava-next": _build_llava_next,
}


def make_tiny_family(family: str, out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random checkpoint of ``family`` (one of ``FAMILIES``) to ``out_dir``.

    The folder loads with ``AutoProcessor`` / ``AutoModelForImageTextToText``. Deterministic
    for a ``seed``: the same bytes on disk, so tests can compare builds and outputs.
    """
    import torch

    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    _BUILDERS[family](out)
    return out
