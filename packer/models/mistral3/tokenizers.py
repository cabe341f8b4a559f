"""Mistral 3's builtin tokenizer ``mistral3``: Mistral's REAL tekken vocabulary, converted offline.

- the vocabulary: ``tekken_240911.json`` from Mistral's ``mistral-common`` package (PyPI; the tokenizer file of
  Pixtral-12B-2409, read as data, never imported): 130,072 byte-level BPE ranks after 1,000 special tokens, so
  rank r is id r + 1000, 131,072 ids in all, the vocabulary of Mistral Small 3.1 / 3.2 (Mistral3's checkpoints;
  tests/models/test_mistral3.py checks ids transformers' own Mistral-Small-3.1 processor tests list);
- its special tokens: the file names none (tekken v3), so they are mistral-common's defaults for such a file
  (``Tekkenizer.DEPRECATED_SPECIAL_TOKENS``, copied here as data: ``<unk>`` = 0, ``<s>`` = 1, ``</s>`` = 2,
  ``[INST]`` = 3, ``[/INST]`` = 4, ..., ``[IMG]`` = 10, ``<pad>`` = 11, ``[IMG_BREAK]`` = 12, ``[IMG_END]`` = 13,
  ..., ``[SYSTEM_PROMPT]`` = 17, ``[/SYSTEM_PROMPT]`` = 18, ``[TOOL_CONTENT]`` = 19), then ``<SPECIAL_20>`` ..
  ``<SPECIAL_999>`` (later tokenizer files name a few of those, e.g. ``[ARGS]``, ``[THINK]``; packer renders none);
- the conversion: transformers 5.23.0's own tekken converter (``integrations.mistral.MistralConverter``, what
  ``convert_tekken_tokenizer`` and ``from_pretrained`` of a tekken.json run), given the file with those special
  tokens written in (the converter reads them from mistral-common >= 1.11.5 otherwise, which caps numpy below
  2.4 on Python <= 3.12; packer pins 1.8.8, which ships the same file byte for byte);
- bos ``<s>``, eos ``</s>``, unk ``<unk>``, pad ``<pad>`` (the converter's); no bos added by the tokenizer (the
  template writes it);
- the chat template: Mistral-Small-3.1-24B-Instruct-2503's (as transformers' Mistral3 processor tests carry
  it), with two changes: no default system prompt (upstream writes one with TODAY's date when a conversation has
  no system turn, so a build's bytes would depend on the day it ran), and a system turn's string content
  renders as its text (upstream tests ``messages[0] is string``, never true, and fails on a string).

``ranks`` names no key of ``shared.tokenizer.RANKS`` (its ranks are tiktoken files): this spec finds its own file
and builds itself (``TekkenTokenizerSpec``).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packer.errors import ConfigError
from packer.models.shared.tokenizer import MistralRenderer, TokenizerSpec, save_tokenizer

TEKKEN_PACKAGE = "mistral_common"
TEKKEN_FILE = "data/tekken_240911.json"
TEKKEN_INSTALL = "mistral-common==1.8.8"
VOCAB_SIZE = 131072
NUM_SPECIAL = 1000

# mistral-common's Tekkenizer.DEPRECATED_SPECIAL_TOKENS (the special tokens of a tekken file that lists none), by rank.
SPECIAL_TOKENS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
)

# Mistral-Small-3.1-24B-Instruct-2503's chat template, less its dated default system prompt, a string system
# content rendered as its text (see above).
MISTRAL3_CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- if messages[0]['content'] is string %}\n"
    "        {%- set system_message = messages[0]['content'] %}\n"
    "    {%- else %}\n"
    "        {%- set system_message = messages[0]['content'][0]['text'] %}\n"
    "    {%- endif %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "    {{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- '[INST]' + message['content'] + '[/INST]' }}\n"
    "        {%- else %}\n"
    "            {{- '[INST]' }}\n"
    "            {%- for block in message['content'] %}\n"
    "                {%- if block['type'] == 'text' %}\n"
    "                    {{- block['text'] }}\n"
    "                {%- elif block['type'] == 'image' or block['type'] == 'image_url' %}\n"
    "                    {{- '[IMG]' }}\n"
    "                {%- else %}\n"
    "                    {{- raise_exception('Only text and image blocks are supported in message content!') }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "            {{- '[/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'system' %}\n"
    "        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {%- if message['content'] is string %}\n"
    "            {{- message['content'] + eos_token }}\n"
    "        {%- else %}\n"
    "            {{- message['content'][0]['text'] + eos_token }}\n"
    "        {%- endif %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user, system and assistant roles are supported!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}"
)


def tekken_file() -> Path:
    """mistral-common's ``tekken_240911.json``, found without importing the package."""
    spec = importlib.util.find_spec(TEKKEN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the builtin tokenizer mistral3 needs the `mistral-common` package: pip install {TEKKEN_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / TEKKEN_FILE
    if not path.exists():
        raise ConfigError(f"{TEKKEN_PACKAGE} is installed but {path} is missing; pip install {TEKKEN_INSTALL}")
    return path


@dataclass(frozen=True)
class TekkenTokenizerSpec(TokenizerSpec):
    """A builtin tokenizer from a tekken JSON file (Mistral's format), converted by transformers' own tekken
    converter; ``added`` is empty: every special token is the file's (or its defaults)."""

    def ranks_file(self) -> Path:
        return tekken_file()

    def build(self, out_dir: str | Path) -> Path:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.mistral.tokenizer import MistralConverter

        raw = json.loads(self.ranks_file().read_text(encoding="utf-8"))
        config = raw["config"]
        if (config["default_vocab_size"], config["default_num_special_tokens"]) != (VOCAB_SIZE, NUM_SPECIAL):
            raise ConfigError(f"{self.ranks_file()}: expected {VOCAB_SIZE} ids with {NUM_SPECIAL} special tokens, "
                              f"the file says {config['default_vocab_size']} and {config['default_num_special_tokens']}")
        if raw.get("special_tokens") is None:
            raw["special_tokens"] = [{"rank": i, "token_str": t, "is_control": True} for i, t in enumerate(SPECIAL_TOKENS)]
        with tempfile.TemporaryDirectory() as tmp:
            vocab = Path(tmp) / "tekken.json"
            vocab.write_text(json.dumps(raw), encoding="utf-8")
            backend = MistralConverter(vocab_file=str(vocab)).converted()
        tok = PreTrainedTokenizerFast(
            tokenizer_object=backend, bos_token=self.bos_token, eos_token=self.eos_token, unk_token="<unk>",
            pad_token=self.pad_token, model_max_length=self.model_max_length, clean_up_tokenization_spaces=False,
        )
        ids = tok.convert_tokens_to_ids(list(SPECIAL_TOKENS))
        if len(tok) != VOCAB_SIZE or ids != list(range(len(SPECIAL_TOKENS))):
            raise ConfigError(f"{self.name}: the converted tokenizer has {len(tok)} ids and special tokens at {ids}")
        tok.chat_template = self.chat_template
        return save_tokenizer(tok, Path(out_dir))


TOKENIZERS = (
    TekkenTokenizerSpec(
        name="mistral3", ranks="tekken_240911", added=(), chat_template=MISTRAL3_CHAT_TEMPLATE,
        fast_renderer=MistralRenderer(image="[IMG]"),  # system / user / assistant turns in pure Python
        bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=131072,
    ),
)
