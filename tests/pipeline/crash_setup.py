"""What the crash tests share (tests/pipeline/test_crash.py, tests/shards/test_object_store.py): a word-level
tokenizer that loads in milliseconds, a corpus of random word records, and the interrupted ``packer build``
subprocess (tests/pipeline/crashing_build.py), so each subprocess costs seconds and only the pipeline is tested.

    tok = word_tokenizer(tmp / "tok", words=WORDS)
    lines = word_records(np.random.default_rng(0), 700, words=WORDS, lengths=(3, 120), chat_every=5,
                         bad_every=61, question_chars=60)
    proc = run_build([corpus, "-o", out, "--tokenizer", tok, "-q"], crash="shard-partial:1")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def word_tokenizer(path: Path, *, words: list[str]) -> str:
    """Save a word-level HF tokenizer of ``words`` (+ ChatML's specials and roles, with its template) at
    ``path``; returns the directory for ``--tokenizer``."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[UNK]", *words, "system", "user", "assistant"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="[UNK]")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(str(path))
    return str(path)


def word_records(
    rng: np.random.Generator, n: int, *, words: list[str], lengths: tuple[int, int], chat_every: int,
    bad_every: int, question_chars: int,
) -> list[str]:
    """``n`` JSONL lines of ``lengths`` random words: text records, a chat every ``chat_every``-th line (its
    first ``question_chars`` characters asked, the rest answered), a bad record every ``bad_every``-th (so
    rejects exist)."""
    out = []
    for i in range(1, n + 1):
        text = " ".join(words[j] for j in rng.integers(0, len(words), size=int(rng.integers(*lengths))))
        if i % bad_every == 0:
            out.append('{"messages": [{"role": "user", "content": 5}]}')
        elif i % chat_every == 0:
            out.append(json.dumps({"messages": [{"role": "user", "content": text[:question_chars]},
                                                {"role": "assistant", "content": text[question_chars:] or "w1"}]}))
        else:
            out.append(json.dumps({"text": text}))
    return out


def build_command(args: list[str], crash: str | None = None) -> list[str]:
    """``packer build ARGS``, or the same build interrupted at ``crash`` (POINT:N[:SIGNAL], crashing_build.py)."""
    if crash is None:
        return [sys.executable, "-m", "packer.cli", "build", *map(str, args)]
    return [sys.executable, "-m", "tests.pipeline.crashing_build", crash, *map(str, args)]


def run_build(args: list[str], crash: str | None = None, *, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """Run ``build_command`` to its end (or its crash) from the repository root, with ``env`` added."""
    return subprocess.run(build_command(args, crash), env={**ENV, **(env or {})}, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
