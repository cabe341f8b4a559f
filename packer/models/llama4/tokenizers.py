"""Llama 4's builtin tokenizer ``llama4``: Llama 4's REAL tokenizer, from Meta's own PyPI package ``llama-models``
(0.3.0), as ``llama3`` is Llama 3's (packer/models/text/tokenizers.py):

- the vocabulary: ``llama_models/llama4/tokenizer.model``, 200,000 tiktoken BPE ranks, split by that package's
  ``Tokenizer.O200K_PATTERN`` (``shared.tokenizer.RANKS["llama4"]``), converted by transformers'
  ``TikTokenConverter``;
- the 2,048 special tokens after them, at their real ids 200,000..202,047, named and ordered as
  ``llama_models.llama4.tokenizer.Tokenizer`` names them (``BASIC_SPECIAL_TOKENS``, then
  ``LLAMA4_SPECIAL_TOKENS``, then ``<|reserved_special_token_i|>`` up to 2,048): ``<|begin_of_text|>`` 200000,
  ``<|header_start|>`` 200005, ``<|header_end|>`` 200006, ``<|eot|>`` 200008, ``<|image_start|>`` 200080,
  ``<|image_end|>`` 200081, ``<|tile_x_separator|>`` 200084, ``<|tile_y_separator|>`` 200085, ``<|image|>`` 200090,
  ``<|patch|>`` 200092 (``Llama4Config``'s ``boi_token_index``, ``eoi_token_index`` and ``image_token_index`` are
  200080, 200081 and 200092: the same ids); 202,048 ids, ``Llama4TextConfig.vocab_size``;
- bos ``<|begin_of_text|>`` (the template writes it; the tokenizer adds it only when asked for special tokens, as
  transformers' ``Llama4Converter`` post-processor does, and packer never asks), eos ``<|eot|>`` (what ends a
  turn), pad ``<|finetune_right_pad|>`` (``Tokenizer.pad_id``);
- the chat template: transformers 5.23.0's ``processing_llama4.chat_template``, ``Llama4Processor``'s default (the
  Llama-4-Scout/Maverick-Instruct template: ``<|header_start|>role<|header_end|>\n\n`` ... ``<|eot|>``, one
  ``<|image|>`` per image part, which the processor replaces with the image's tiles), unchanged. It defines a
  ``date_string`` from today's date but never writes it, so renderings do not depend on the day.
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, Llama4Renderer, TokenizerSpec

NUM_SPECIAL = 2048
"""``Tokenizer.num_reserved_special_tokens``: ids 200,000..202,047."""


def _reserved(name: str, count: int, start: int = 0) -> tuple[str, ...]:
    """``llama_models.llama4.tokenizer.get_reserved_special_tokens``."""
    return tuple(f"<|{name}_reserved_special_token_{i}|>" for i in range(start, start + count))


BASIC_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")
TEXT_POST_TRAIN_SPECIAL_TOKENS = (
    "<|header_start|>", "<|header_end|>", "<|eom|>", "<|eot|>", "<|step|>",
    *_reserved("text_post_train", 6), "<|python_start|>", "<|python_end|>", "<|finetune_right_pad|>",
    *_reserved("text_post_train", 61, 8),
)
VISION_SPECIAL_TOKENS = (
    "<|image_start|>", "<|image_end|>", "<|vision_reserved_special_token_0|>", "<|vision_reserved_special_token_1|>",
    "<|tile_x_separator|>", "<|tile_y_separator|>", *_reserved("vision", 4, 2), "<|image|>",
    "<|vision_reserved_special_token_6|>", "<|patch|>", *_reserved("vision", 1041, 7),
)
REASONING_SPECIAL_TOKENS = (*_reserved("reasoning", 8), "<|reasoning_thinking_start|>", "<|reasoning_thinking_end|>")
_NAMED = BASIC_SPECIAL_TOKENS + TEXT_POST_TRAIN_SPECIAL_TOKENS + VISION_SPECIAL_TOKENS + REASONING_SPECIAL_TOKENS
LLAMA4_SPECIAL_TOKENS = _NAMED + tuple(f"<|reserved_special_token_{i}|>" for i in range(NUM_SPECIAL - len(_NAMED)))
"""All 2,048, in id order from 200,000 (``Tokenizer.special_tokens``)."""
LLAMA4_BASE_TOKENS = 200000

# transformers 5.23.0 processing_llama4.chat_template (Llama4Processor's default), unchanged.
LLAMA4_CHAT_TEMPLATE = (
    '{{- bos_token }}\n'
    '{%- if custom_tools is defined %}\n'
    '    {%- set tools = custom_tools %}\n'
    '{%- endif %}\n'
    '{%- if not tools_in_user_message is defined %}\n'
    '    {%- set tools_in_user_message = true %}\n'
    '{%- endif %}\n'
    '{%- if not date_string is defined %}\n'
    '    {%- if strftime_now is defined %}\n'
    '        {%- set date_string = strftime_now("%d %b %Y") %}\n'
    '    {%- else %}\n'
    '        {%- set date_string = "26 Jul 2024" %}\n'
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- if not tools is defined %}\n'
    '    {%- set tools = none %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- This block extracts the system message, so we can slot it into the right place. #}\n'
    "{%- if messages[0]['role'] == 'system' %}    \n"
    "    {%- if messages[0]['content'] is string %}\n"
    "        {%- set system_message = messages[0]['content']|trim %}\n"
    '    {%- else %}\n'
    '        {#- FIXME: The processor requires an array, always. #}\n'
    "        {%- set system_message = messages[0]['content'][0]['text']|trim %}\n"
    '    {%- endif %}\n'
    '    {%- set messages = messages[1:] %}\n'
    '    {%- set user_supplied_system_message = true %}\n'
    '{%- else %}\n'
    '    {%- set system_message = "" %}\n'
    '    {%- set user_supplied_system_message = false %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- System message if the user supplied one #}\n'
    '{%- if user_supplied_system_message %}\n'
    '    {{- "<|header_start|>system<|header_end|>\n'
    '\n'
    '" }}\n'
    '    {%- if tools is not none %}\n'
    '        {{- "Environment: ipython\n'
    '" }}\n'
    '    {%- endif %}\n'
    '    {%- if tools is not none and not tools_in_user_message %}\n'
    '        {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n'
    '        {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
    '        {{- "Do not use variables.\n'
    '\n'
    '" }}\n'
    '        {%- for t in tools %}\n'
    '            {{- t | tojson(indent=4) }}\n'
    '            {{- "\n'
    '\n'
    '" }}\n'
    '        {%- endfor %}\n'
    '    {%- endif %}\n'
    '    {{- system_message }}\n'
    '    {{- "<|eot|>" }}\n'
    '{%- endif %}\n'
    '\n'
    '{#- Custom tools are passed in a user message with some extra guidance #}\n'
    '{%- if tools_in_user_message and not tools is none %}\n'
    '    {#- Extract the first user message so we can plug it in here #}\n'
    '    {%- if messages | length != 0 %}\n'
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    '        {%- set messages = messages[1:] %}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n'
    '{%- endif %}\n'
    "    {{- '<|header_start|>user<|header_end|>\n"
    '\n'
    "' -}}\n"
    '    {{- "Given the following functions, please respond with a JSON for a function call " }}\n'
    '    {{- "with its proper arguments that best answers the given prompt.\n'
    '\n'
    '" }}\n'
    '    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n'
    '    {{- "Do not use variables.\n'
    '\n'
    '" }}\n'
    '    {%- for t in tools %}\n'
    '        {{- t | tojson(indent=4) }}\n'
    '        {{- "\n'
    '\n'
    '" }}\n'
    '    {%- endfor %}\n'
    '    {{- first_user_message + "<|eot|>"}}\n'
    '{%- endif %}\n'
    '\n'
    '{%- for message in messages %}\n'
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "    {{- '<|header_start|>' + message['role'] + '<|header_end|>\n"
    '\n'
    "' }}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- message['content'] }}\n"
    '        {%- else %}\n'
    "            {%- for content in message['content'] %}\n"
    "                {%- if content['type'] == 'image' %}\n"
    "                    {{- '<|image|>' }}\n"
    "                {%- elif content['type'] == 'text' %}\n"
    "                    {{- content['text'] }}\n"
    '                {%- endif %}\n'
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    '        {{- "<|eot|>" }}\n'
    "    {%- elif 'tool_calls' in message and message.tool_calls|length > 0 %}\n"
    "       {{- '<|header_start|>assistant<|header_end|>\n"
    '\n'
    "' -}}\n"
    "       {{- '<|python_start|>' }}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- message['content'] }}\n"
    '        {%- else %}\n'
    "            {%- for content in message['content'] %}\n"
    "                {%- if content['type'] == 'image' %}\n"
    "                    {{- '<|image|>' }}\n"
    "                {%- elif content['type'] == 'text' %}\n"
    "                    {{- content['text'] }}\n"
    '                {%- endif %}\n'
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    "       {{- '<|python_end|>' }}\n"
    '        {%- for tool_call in message.tool_calls %}\n'
    '           {{- \'{"name": "\' + tool_call.function.name + \'", \' }}\n'
    '           {{- \'"parameters": \' }}\n'
    '           {{- tool_call.function.arguments | tojson }}\n'
    '           {{- "}" }}\n'
    '        {%- endfor %}\n'
    '       {{- "<|eot|>" }}\n'
    '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
    '        {{- "<|header_start|>ipython<|header_end|>\n'
    '\n'
    '" }}\n'
    '        {%- if message.content is mapping or message.content is iterable %}\n'
    '            {{- message.content | tojson }}\n'
    '        {%- else %}\n'
    '            {{- message.content }}\n'
    '        {%- endif %}\n'
    '        {{- "<|eot|>" }}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|header_start|>assistant<|header_end|>\n"
    '\n'
    "' }}\n"
    '{%- endif %}\n'
)


TOKENIZERS = (
    TokenizerSpec(
        name="llama4", ranks="llama4", added=(AddedTokens(LLAMA4_SPECIAL_TOKENS),),
        bos_token="<|begin_of_text|>", eos_token="<|eot|>", pad_token="<|finetune_right_pad|>",
        model_max_length=131072, chat_template=LLAMA4_CHAT_TEMPLATE,
        fast_renderer=Llama4Renderer(image="<|image|>"),  # text turns and images in pure Python
    ),
)
