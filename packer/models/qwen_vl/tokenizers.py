"""The Qwen-VL family's builtin tokenizers: the real Qwen2 vocabulary (``shared.tokenizer.RANKS["qwen2"]``)
rebuilt offline, with each model's added tokens at their real ids and its chat template.

``qwen2-vl``: Qwen2-VL's 14 special tokens (151643-151656) and Qwen2-VL-Instruct's ChatML template
("Hello world!" -> [9707, 1879, 0]).

``qwen2.5``: Qwen2.5-Instruct's: the same ranks, Qwen2.5's 22 added tokens with their real ids (``<tool_call>``
= 151657, ``</tool_call>`` = 151658 and the FIM tokens are added but not special, as in Qwen2.5's
tokenizer_config.json) and Qwen2.5-Instruct's chat template, which renders tools (in the system prompt),
``tool_calls`` (``<tool_call>`` JSON) and ``tool`` turns (``<tool_response>`` inside a user turn). It is the
builtin for tool-use data: Qwen2-VL's template has no tool support.

``qwen3-vl``: Qwen3-VL's: the same ranks and pre-tokenizer (Qwen3 kept Qwen2's BPE), Qwen3's 26 added tokens
with their real ids (Qwen2.5's 22, then ``<tool_response>`` 151665, ``</tool_response>`` 151666, ``<think>``
151667, ``</think>`` 151668, not special) and Qwen3-VL-Instruct's chat template (``QWEN3_VL_CHAT_TEMPLATE``).
Qwen3-VL's config uses Qwen2-VL's vision ids (image 151655, video 151656, vision start/end 151652/151653).

``qwen3.5-standin``: a STAND-IN for Qwen3.5's tokenizer, which ships on no package registry. Qwen3.5's real
vocabulary has 248,320 entries (its own BPE, a pre-tokenizer that also keeps combining marks ``\\p{M}`` with
letters, ``<|image_pad|>`` = 248056; transformers' ``Qwen3_5Tokenizer`` and ``Qwen3_5Config``), and only a
checkpoint directory carries it. The stand-in is ``qwen3-vl`` under another name: Qwen3's vocabulary (the Qwen2
ranks with Qwen3's 26 added tokens at Qwen3's ids: ``<|im_end|>`` 151645, ``<think>`` 151667) and the
Qwen3-VL-Instruct ChatML template (no default system prompt, tools, no thinking blocks). Packing and its
exactness do not depend on the vocabulary, so the proof and the tests run on it; to train a real Qwen3.5, pass
its tokenizer directory (``--tokenizer /path/to/Qwen3.5-9B``): the ids then are Qwen3.5's own.
"""

from __future__ import annotations

from packer.models.shared.qwen_vocab import (
    QWEN2_VL_SPECIAL_TOKENS,
    QWEN3_EXTRA_TOKENS,
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN25_EXTRA_TOKENS,
)
from packer.models.shared.tokenizer import AddedTokens, ChatMLRenderer, TokenizerSpec

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

def _qwen(name: str, extra: tuple[str, ...], template: str, **kw) -> TokenizerSpec:
    return TokenizerSpec(
        name=name, ranks="qwen2",
        added=(AddedTokens(QWEN2_VL_SPECIAL_TOKENS), AddedTokens(extra, special=False)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", additional_special_tokens=QWEN2_VL_SPECIAL_TOKENS,
        chat_template=template, **kw,
    )


_QWEN3_VL = ChatMLRenderer(default_system="", image="<|vision_start|><|image_pad|><|vision_end|>",
                           video="<|vision_start|><|video_pad|><|vision_end|>", roles=("system", "user", "assistant"))

TOKENIZERS = (
    _qwen("qwen2-vl", (), QWEN2_VL_CHAT_TEMPLATE, fast_renderer=ChatMLRenderer(
        default_system="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        image="<|vision_start|><|image_pad|><|vision_end|>",
        video="<|vision_start|><|video_pad|><|vision_end|>",
    )),
    # Qwen2.5 and Qwen3-VL write a tool turn otherwise (inside a user turn) and Qwen2.5 no parts: Jinja's
    _qwen("qwen2.5", QWEN25_EXTRA_TOKENS, QWEN25_CHAT_TEMPLATE, fast_renderer=ChatMLRenderer(
        default_system="<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                       "<|im_end|>\n",
        image=None, video=None, roles=("system", "user", "assistant"),
    )),
    _qwen("qwen3-vl", QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS, QWEN3_VL_CHAT_TEMPLATE, fast_renderer=_QWEN3_VL),
    _qwen("qwen3.5-standin", QWEN25_EXTRA_TOKENS + QWEN3_EXTRA_TOKENS, QWEN3_VL_CHAT_TEMPLATE,
          fast_renderer=_QWEN3_VL),
)
