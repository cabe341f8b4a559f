"""The encoder's smaller costs, which its comments point to (docs/benchmarks.md, "Encode: the smaller costs").

On bench_build's corpus (2,000 records): one conversation rendered by the Jinja template vs the pure-Python
ChatML renderer vs tokenized; the token byte-length table; the pickled Encoder a worker loads; importing what
unpickling a transformers tokenizer would need; loading the builtin tokenizer with and without its added tokens
listed in tokenizer_config.json. CPU time, best of several runs.

    python scripts/bench_encode.py
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_build import make_corpus  # noqa: E402

from packer.encode.encoder import Encoder  # noqa: E402
from packer.encode.templates import hf_message  # noqa: E402
from packer.encode.tokenize import special_token_mask, token_byte_lengths  # noqa: E402
from packer.encode.tokenizers import ensure_builtin, load_tokenizer  # noqa: E402
from packer.formats.read import parse_line  # noqa: E402
from packer.models import get_profile  # noqa: E402


def best(f: Callable[[], object], runs: int = 5) -> float:
    """The least CPU time of ``runs`` calls of ``f``, in seconds."""
    times = []
    for _ in range(runs):
        t = time.process_time()
        f()
        times.append(time.process_time() - t)
    return min(times)


def import_seconds(statement: str) -> float:
    """Wall time of ``statement`` in a fresh interpreter (best of 3)."""
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    return min(float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(3))


def main() -> None:
    tok = load_tokenizer("qwen2-vl")
    encoder = Encoder(tok, get_profile("qwen2-vl"))
    chat, backend = encoder._chat, tok.backend_tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, SHARED / "data" / "coco-mini", 2000)
        lines = corpus.read_bytes().splitlines()
    convs = [parse_line(raw, path="c", line=i + 1, base_dir="/").root.messages for i, raw in enumerate(lines)]
    marked = [[hf_message(m, marked=True) for m in c] for c in convs]
    texts = [chat._fast.locate(c)[0] for c in convs]
    tokens = sum(len(e.ids) for e in backend.encode_batch_fast(texts, add_special_tokens=False))
    n = len(convs)
    jinja = best(lambda: [chat.render(c) for c in marked]) / n
    fast = best(lambda: [chat._fast.locate(c) for c in convs]) / n
    tokenize = best(lambda: backend.encode_batch_fast(texts, add_special_tokens=False)) / n
    print(f"{n} conversations, {tokens / n:.0f} tokens each, per conversation:")
    print(f"  Jinja render {jinja * 1e3:.3f} ms, ChatML {fast * 1e3:.4f} ms ({jinja / fast:.1f}x), "
          f"tokenizer {tokenize * 1e3:.3f} ms")
    size = special_token_mask(tok).shape[0]
    print(f"token_byte_lengths: {best(lambda: token_byte_lengths(backend, size=size), 3):.3f} s; "
          f"repr(tokenizer.model): {best(lambda: repr(backend.model), 3):.3f} s")
    blob = pickle.dumps(encoder, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"pickled Encoder: {len(blob) / 2**20:.1f} MiB, unpickled in {best(lambda: pickle.loads(blob), 3):.2f} s")
    print(f"import transformers' tokenizer classes: "
          f"{import_seconds('import transformers.tokenization_utils_tokenizers'):.2f} s; "
          f"AutoTokenizer (imports torch): {import_seconds('from transformers import AutoTokenizer'):.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        listed, plain = ensure_builtin("qwen2-vl"), Path(tmp) / "plain"
        shutil.copytree(listed, plain)  # as save_pretrained wrote it: no added_tokens_decoder
        config = json.loads((plain / "tokenizer_config.json").read_text())
        del config["added_tokens_decoder"]
        (plain / "tokenizer_config.json").write_text(json.dumps(config))
        cls = type(tok)
        with_list, without = (best(lambda d=d: cls.from_pretrained(str(d)), 3) for d in (listed, plain))
    print(f"builtin qwen2-vl from_pretrained: {with_list:.2f} s with its added tokens in tokenizer_config.json, "
          f"{without:.2f} s without (transformers then parses tokenizer.json in Python)")


if __name__ == "__main__":
    main()
