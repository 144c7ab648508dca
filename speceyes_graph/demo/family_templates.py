"""The chat templates of the eleven tiny families (:mod:`.tiny_families`), as each family's
instruct checkpoint ships them: the rendered prompt is what the model sees, so whitespace
and the BOS a template writes are kept."""

from __future__ import annotations

from speceyes_graph.demo.tiny import QWEN_CHAT_TEMPLATE

__all__ = ["CHAT_TEMPLATES", "PALIGEMMA_CHAT_TEMPLATE"]

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

# meta-llama/Llama-3.2-11B-Vision-Instruct, chat_template.json (the same string in its
# tokenizer_config.json). Starts with {{- bos_token }} (the Llama 3 tokenizer also adds
# <|begin_of_text|>). A system message together with an image raises "Prompting with images is
# incompatible with system messages." -- whatever the system text: its list content is trimmed
# to the list's repr, never "", so an empty one raises too. Without an image it writes a system
# turn with today's date (strftime_now). A system prompt has to go into the first user turn.
_MLLAMA_TEMPLATE = (
    r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- Find out if there are any images #}
{% set image_ns = namespace(has_images=false) %}"""
    "      \n"  # six spaces of trailing whitespace, as published
    r"""{%- for message in messages %}
    {%- for content in message['content'] %}
        {%- if content['type'] == 'image' %}
            {%- set image_ns.has_images = true %}
        {%- endif %}
    {%- endfor %}
{%- endfor %}

{#- Error out if there are images and system message #}
{%- if image_ns.has_images and not system_message == "" %}
    {{- raise_exception("Prompting with images is incompatible with system messages.") }}
{%- endif %}

{#- System message if there are no images #}
{%- if not image_ns.has_images %}
    {{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
    {%- if tools is not none %}
        {{- "Environment: ipython\n" }}
    {%- endif %}
    {{- "Cutting Knowledge Date: December 2023\n" }}
    {{- "Today Date: " + date_string + "\n\n" }}
    {%- if tools is not none and not tools_in_user_message %}
        {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
        {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
        {{- "Do not use variables.\n\n" }}
        {%- for t in tools %}
            {{- t | tojson(indent=4) }}
            {{- "\n\n" }}
        {%- endfor %}
    {%- endif %}
    {{- system_message }}
    {{- "<|eot_id|>" }}
{%- endif %}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}
        {%- if message['content'] is string %}
            {{- message['content'] }}
        {%- else %}
            {%- for content in message['content'] %}
                {%- if content['type'] == 'image' %}
                    {{- '<|image|>' }}
                {%- elif content['type'] == 'text' %}
                    {{- content['text'] }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
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
    "mllama": _MLLAMA_TEMPLATE,
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
