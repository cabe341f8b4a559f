"""The Qwen2 vocabulary's added tokens, shared by every family whose language model is a Qwen (Qwen-VL, and the
InternVL, Molmo2 and LLaVA-OneVision LLMs): the ``qwen2`` ranks (``shared.tokenizer.RANKS``) end at 151642,
and these follow with their real ids. Also the Qwen3-VL-Instruct chat template, which the ``qwen3-vl`` builtin and
the Qwen3.5 stand-in (``qwen_vl/tokenizers.py``) both render with.
"""

from __future__ import annotations

# Appended in this order so each gets its real Qwen2-VL id: <|endoftext|> = 151643 ... <|video_pad|> = 151656.
QWEN2_VL_SPECIAL_TOKENS = (
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
)
QWEN2_VL_FIRST_SPECIAL_ID = 151643

# Qwen2.5 adds these after Qwen2-VL's 14, not special (ids 151657-151664), per its tokenizer_config.json.
QWEN25_EXTRA_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

# Qwen3 adds these after Qwen2.5's 22, not special (ids 151665-151668), per Qwen3's tokenizer_config.json.
QWEN3_EXTRA_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")

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
