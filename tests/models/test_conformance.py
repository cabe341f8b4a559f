"""Every registered family, through the protocol only: build, verify, read, collate, and packed == unpacked on the
family's real transformers class. One parametrized test over ``profile_names()``: a family that registers passes
it or fails here, whatever its package holds. What is specific to a family (its processor's exact counts and
ids, pan-and-scan, tiling rules, timestamps) stays in that family's own tests.

The corpus is the same for every family: text, a chat and a text tree, a chat with an image, two images in one turn, a caption tree
with the image in its prefix and a nested branch, a LLaVA conversation, and for a family with video a clip under
a QA tree. Images are small generated PNGs of three shapes (square, wide, tall) so multi-tile layouts occur. A
record a family cannot take is rejected with a reason (and accounted for by ``verify --input``), never packed
wrong. The equivalence runs the family's proof (``ModelProfile.proof()``: its tiny model, each root-to-leaf path
alone with the model's own defaults) against the packed forward of one multi-row batch (sdpa_varlen), the
collated batch passed straight to the model (``model(**batch)``) included.
"""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from packer.config import BuildConfig
from packer.core.types import IGNORE_INDEX
from packer.encode.tokenizers import load_tokenizer
from packer.models import get_profile, profile_names
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from packer.train.hf import attn_implementations, model_inputs, use_packed_attention
from tests.media.make_videos import write_clip
from tests.models import released

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

# Each family builds, verifies and proves itself on its real model: seconds per family, the whole suite's
# (``make test``, CI) and not the edit loop's (``make test-fast``).
pytestmark = pytest.mark.slow

SIZES = {"square.png": (64, 64), "wide.png": (120, 48), "tall.png": (40, 100)}


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _records(video: bool) -> list[dict]:
    img = lambda name, text: [{"type": "image", "image": name}, {"type": "text", "text": text}]  # noqa: E731
    recs = [
        {"text": "A plain document, long enough to carry some loss on every token of it."},
        {"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One two three."}]},
        {"messages": [{"role": "user", "content": "Name a colour."}],
         "branches": [[{"role": "assistant", "content": "Blue."}], [{"role": "assistant", "content": "Red, or green."}]]},
        {"messages": [{"role": "user", "content": img("wide.png", "Describe the image.")},
                      {"role": "assistant", "content": "Coloured noise, wider than tall."}]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "square.png"},
                                                   {"type": "text", "text": "and"},
                                                   {"type": "image", "image": "tall.png"}]},
                      {"role": "assistant", "content": "Two noisy pictures."}]},
        {"messages": [{"role": "user", "content": img("tall.png", "Write a caption.")}],
         "branches": [[{"role": "assistant", "content": "Static."}],
                      [{"role": "assistant", "content": "Random pixels, tall."}],
                      {"messages": [{"role": "assistant", "content": "Noise"}],
                       "branches": [[{"role": "user", "content": "Shorter?"}, {"role": "assistant", "content": "No."}],
                                    [{"role": "user", "content": "Longer?"},
                                     {"role": "assistant", "content": "Noise, all of it."}]]}]},
        {"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"}, {"from": "gpt", "value": "Pixels."}],
         "image": "square.png"},
    ]
    if video:
        recs.append({"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"},
                                                               {"type": "text", "text": "What happens?"}]}],
                     "branches": [[{"role": "assistant", "content": "The grey changes."}],
                                  [{"role": "assistant", "content": "Nothing much."}]]})
    return recs


@pytest.fixture(scope="module", params=profile_names())
def family(request, tmp_path_factory):
    """One profile's build of the corpus: its config, its rows, its rejects."""
    name = request.param
    profile = get_profile(name)
    root = tmp_path_factory.mktemp(f"conformance-{name}")
    for i, (file, (w, h)) in enumerate(SIZES.items()):
        (root / file).write_bytes(_png(w, h, seed=i))
    if profile.video is not None:
        write_clip(root / "clip.mp4", fps=4, frames=8, width=64, height=48)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(profile.video is not None)))
    tokenizer = profile.default_tokenizer or "qwen2-vl"
    options = {"max_pixels": 64 * 28 * 28, "min_pixels": 16 * 28 * 28} if "max_pixels" in profile.overridable else {}
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=name, tokenizer=tokenizer,
                                     max_length=16384, rows_per_shard=2, **options)
    result = build(config, progress=False)
    return {"name": name, "profile": get_profile(name, **config.profile_overrides()), "root": root, "data": data,
            "tokenizer": tokenizer, "result": result, "rows": list(PackedDataset(root / "out", shuffle=False)),
            "options": options}


def test_build_and_verify(family):
    """Every line packed or rejected with a reason; the shards keep every invariant of docs/format.md."""
    totals = family["result"].manifest["totals"]
    assert totals["examples"] + totals["rejected"] == len(_records(family["profile"].video is not None))
    if family["profile"].image is None:
        assert totals["examples"] == 3  # the text, the chat and the text tree; every image record is refused
    else:
        assert totals["rejected"] == 0, (family["root"] / "out" / "rejects.jsonl").read_text()
    report = verify_build(family["root"] / "out", inputs=[str(family["data"])])
    assert report.ok, report.lines()


def test_rows_read_and_collate(family):
    """Rows collate to one batch whose media inputs are the family's forward keys, every image and video at a
    run of its own tokens, spans inside the batch."""
    profile, rows = family["profile"], family["rows"]
    batch = collate(rows)
    T = batch["input_ids"].shape[-1]
    images = [im for r in rows for im in r["images"]]
    videos = [v for r in rows for v in r["videos"]]
    if images:
        assert batch["image_offsets"].tolist() == sorted(batch["image_offsets"].tolist()) or profile.video is not None
        assert len(batch["image_offsets"]) >= len(images)
    if videos:
        assert len(batch["video_offsets"]) == len(videos)
    inputs = model_inputs(batch)
    media_keys = set(inputs) - {"input_ids", "position_ids", "attention_mask", "packer_layout", "use_cache"}
    assert media_keys <= set(profile.forward_keys) | {"mm_token_type_ids", "token_type_ids"}, media_keys
    for a, b, *_ in batch.get("bidirectional_spans", torch.zeros(0, 2)).tolist():
        assert 0 <= a < b <= T
    assert int((batch["labels"] != IGNORE_INDEX).sum()) == batch["num_loss_tokens"] > 0


def test_packed_equals_unpacked_on_the_real_model(family):
    """The family's proof: per-token losses, total and every gradient of the packed forward (one batch of all
    rows) equal every root-to-leaf path alone; ``model(**collate(rows))`` equals the explicit inputs. The batch's
    pixels come from the image processor the released files configure (``released.released_reader``), not one
    made from the profile: a profile default that drifts from them fails here."""
    profile = family["profile"]
    proof = profile.proof()
    token_ids = ce.profile_token_ids(profile, load_tokenizer(family["tokenizer"]))
    with released.released_reader(profile, **family["options"]):
        rows = collate(family["rows"])
    (batch,), ids, vocab = ce.compact_vocab([rows], token_ids)
    torch.manual_seed(0)
    model = proof.tiny_model(token_ids=ids, vocab_size=vocab)
    assert type(model).__name__ == proof.model_class
    report = ce.compare(model, batch, ["sdpa_varlen"], profile=profile, token_ids=ids)
    assert report["sdpa_varlen"]["ok"], json.dumps(report)
    assert report["sdpa_varlen"]["grad_missing"] == [] and report["sdpa_varlen"]["grad_params"] > 0
    assert report["paths"] > len(batch["example_ids"])  # the trees' branches ran as paths of their own
    use_packed_attention(model, "sdpa_varlen")
    with torch.no_grad():
        raw, explicit = model(**batch).logits, model(**model_inputs(batch)).logits
    model.set_attn_implementation(attn_implementations(model, "sdpa"))
    torch.testing.assert_close(raw, explicit, rtol=0, atol=0)
