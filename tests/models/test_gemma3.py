"""Gemma 3 against transformers 5.23.0's ``Gemma3Processor`` (PIL image processor, 896 px): 256 tokens per image
for every COCO-mini image, the processor's input_ids (begin/end-of-image tokens and the "\\n\\n" around
them) and token_type_ids, and its pixel values; the same with pan-and-scan crops (``do_pan_and_scan``). Packed == unpacked on the model is
tests/train/test_gemma3_equivalence.py.

Tokenizer: the builtin ``gemma3`` STAND-IN (Qwen2's ranks + Gemma 3's special tokens; Gemma's own
SentencePiece model is on no registry). The processor runs the same tokenizer on the text Gemma 3's own chat
template renders (``<start_of_image>`` per image), so what is compared is the image expansion.
"""

from __future__ import annotations

import io
import json
import types

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.formats import parse_record
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.gemma3 import Gemma3Profile
from packer.pipeline.build import build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.models import released

EXPANDED = "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"  # the builtin template's image part


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("gemma3")


@pytest.fixture(scope="module")
def processor(tok):
    # google/gemma-3-*-it's files (tests/models/released/gemma3.json): 896x896, image_seq_length 256, no pan-and-scan
    seq = released.file_values(released.entry_of("gemma3"), "processor_config.json")["image_seq_length"]
    return transformers.Gemma3Processor(image_processor=released.image_processor("gemma3"), tokenizer=tok,
                                        image_seq_length=seq)


@pytest.mark.slow
def test_every_coco_image_is_256_tokens(coco_images, processor) -> None:
    profile = get_profile("gemma3")
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images]
    want = processor._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])["num_image_tokens"]
    assert [profile.image.num_tokens(w, h) for w, h in sizes] == want == [256] * len(sizes)
    grids = np.array([profile.image.grid_thw(w, h) for w, h in sizes + [(1, 1), (5000, 3)]])
    assert profile.image.grid_num_tokens(grids).tolist() == [256] * (len(sizes) + 2)
    assert profile.image.grid_num_tokens(np.array([(1, 16, 8), (2, 16, 16)])).tolist() == [-1, -1]
    assert profile.bidirectional_images and not profile.positions.mrope


def test_input_ids_token_types_and_pixels_match_the_processor(coco_images, tok, processor) -> None:
    files = coco_images[5:7]
    img = lambda p: {"type": "image", "image": str(p)}  # noqa: E731
    rec = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, img(files[0]),
                                     {"type": "text", "text": "and "}, img(files[1]), {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": "They match."}]}
    enc = Encoder(tok, get_profile("gemma3")).encode(parse_record(rec, path="t.jsonl", line=1, base_dir="/"))
    messages = [{"role": m["role"], "content": [{"type": "image"} if p.get("type") == "image" else p
                                                for p in m["content"]] if isinstance(m["content"], list)
                 else m["content"]} for m in rec["messages"]]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.count(EXPANDED) == 2
    gemma_text = text.replace(EXPANDED, "<start_of_image>")  # what Gemma 3's own template renders
    images = [Image.open(p).convert("RGB") for p in files]
    out = processor(text=[gemma_text], images=[images], return_tensors="np", add_special_tokens=False)
    assert enc.input_ids.tolist() == out["input_ids"][0].tolist()
    types = np.zeros(len(enc.input_ids), dtype=np.int64)
    for im in enc.images:  # each image's bidirectional block: its soft tokens, not begin/end
        types[im.offset : im.offset + im.num_tokens] = 1
    assert types.tolist() == out["token_type_ids"][0].tolist()
    pixels = get_profile("gemma3").reader().pixel_values([ImageRef(path=str(p)) for p in files])["pixel_values"]
    assert np.array_equal(pixels.numpy(), out["pixel_values"])
    assert isinstance(get_profile("gemma3").reader().image_processor(), transformers.Gemma3ImageProcessorPil)


# pan-and-scan: odd sizes around each rule (ratio 1.2, crop side 256, 4 crops, rounding half up) and extremes
ODD_SIZES = [(1, 1), (1, 700), (700, 1), (5000, 10), (10, 5000), (1199, 1000), (1200, 1000), (1000, 1200),
             (511, 256), (512, 256), (767, 256), (768, 256), (256, 1024), (2000, 500), (2500, 500), (3000, 500),
             (900, 300), (300, 900), (640, 480), (480, 640), (1023, 400), (1025, 400)]
PAS = get_profile("gemma3", do_pan_and_scan=True)


def _png(w: int, h: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.slow
def test_pan_and_scan_crops_match_the_processor(coco_images) -> None:
    """Crops counted from the header equal Gemma3ImageProcessorPil's ``pan_and_scan`` on every COCO-mini image
    (the decoded pixels) and its whole output (``num_crops``, pixel blocks) on odd sizes."""
    proc = released.image_processor("gemma3")
    rule = dict(pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2)
    counts = {}
    for path in coco_images:
        ref = ImageRef(path=str(path))
        w, h = PAS.image.plan(ref)
        chw = np.asarray(load_image(ref)).transpose(2, 0, 1)
        crops = proc.pan_and_scan(chw, **rule)
        rows, cols = PAS.image.crop_layout(w, h)
        assert len(crops) == rows * cols, path
        assert all(c.shape[1:] == (-(-h // rows), -(-w // cols)) for c in crops[:-1])  # ceil-sized crops
        counts[rows * cols] = counts.get(rows * cols, 0) + 1
    assert len(coco_images) > 200 and len(counts) > 1  # COCO holds cropped (4:3) and uncropped images
    # the whole processor on odd sizes, at 56 px (the crop rule does not look at the output size): cheap pixels
    small = Gemma3Profile(name="gemma3-56", image_px=56, tokens_per_image=4, do_pan_and_scan=True)
    refs = [ImageRef(data=_png(w, h)) for w, h in ODD_SIZES]
    out = released.image_processor("gemma3", size={"height": 56, "width": 56})(
        images=[load_image(r) for r in refs], do_pan_and_scan=True, return_tensors="np", **rule)
    assert [small.image.plan(r) for r in refs] == ODD_SIZES
    assert [r * c for r, c in (small.image.crop_layout(w, h) for w, h in ODD_SIZES)] == out["num_crops"].tolist()
    assert {0, 2, 3, 4} <= set(out["num_crops"].tolist())
    entries = [(r, g) for r, (w, h) in zip(refs, ODD_SIZES, strict=True)
               for g in [run.grid for run in (small.image.blocks((w, h)) or types.SimpleNamespace(runs=[small.image.run((w, h))])).runs]]
    assert small.image.grid_num_tokens(np.array([g for _, g in entries])).tolist() == [4] * len(out["pixel_values"])
    pixels = small.reader().pixel_inputs([r for r, _ in entries], [g for _, g in entries])["pixel_values"]
    assert np.array_equal(pixels.numpy(), out["pixel_values"])
    assert PAS.image.grid_num_tokens(np.array([(6, 16, 16), (0, 16, 16)])).tolist() == [-1, -1]  # 4 crops at most


@pytest.mark.slow
def test_pan_and_scan_input_ids_and_pixels_match_the_processor(tmp_path, coco_images, tok, processor) -> None:
    """A build with ``profile_options: {do_pan_and_scan: true}``: each example's tokens equal the processor's
    input_ids (the crops' blocks and the text between them) and token_type_ids (one bidirectional block per
    crop); the reader's pixel values equal the processor's. Uncropped images (square, COCO at 4:3 kept whole by
    a 1.4 ratio) sit beside cropped ones."""
    (tmp_path / "wide.png").write_bytes(_png(1000, 400))
    (tmp_path / "square.png").write_bytes(_png(300, 300, 1))
    img = lambda p: {"type": "image", "image": str(p)}  # noqa: E731
    records = [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"}, img(tmp_path / "wide.png"),
                                                   {"type": "text", "text": "and"}, img(tmp_path / "square.png"),
                                                   img(coco_images[0]), {"type": "text", "text": "?"}]},
                      {"role": "assistant", "content": "They match."}]},
        {"messages": [{"role": "user", "content": [img(coco_images[1]), {"type": "text", "text": "Describe."}]},
                      {"role": "assistant", "content": "A photo."}]},
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    options = {"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": 1.4}
    build(BuildConfig.from_inputs([str(data)], str(tmp_path / "out"), profile="gemma3", max_length=8192,
                                  profile_options=options), progress=False)
    rows = list(PackedDataset(tmp_path / "out", shuffle=False))
    kw = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=256, pan_and_scan_max_num_crops=4,
              pan_and_scan_min_ratio_to_activate=1.4)
    seen = 0
    for row in rows:
        batch = collate([row])
        cu, blocks = batch["cu_seqlens"].tolist(), 0
        for e, example_id in enumerate(batch["example_ids"]):
            rec = records[int(example_id.rsplit(":", 1)[1]) - 1]
            messages = [{"role": m["role"], "content": [{"type": "image"} if p.get("type") == "image" else p
                                                        for p in m["content"]] if isinstance(m["content"], list)
                         else m["content"]} for m in rec["messages"]]
            text = tok.apply_chat_template(messages, tokenize=False).replace(EXPANDED, "<start_of_image>")
            pics = [Image.open(p["image"]).convert("RGB") for m in rec["messages"] if isinstance(m["content"], list)
                    for p in m["content"] if p.get("type") == "image"]
            want = processor(text=[text], images=[pics], return_tensors="pt", add_special_tokens=False, **kw)
            got = batch["input_ids"][0, cu[e] : cu[e + 1]]
            assert got.tolist() == want["input_ids"][0].tolist(), example_id
            labels = batch["labels"][0, cu[e] : cu[e + 1]]
            assert tok.decode(labels[labels != -100]) == rec["messages"][1]["content"] + "<end_of_turn>"  # spans moved
            types_ = torch.zeros(cu[e + 1] - cu[e], dtype=torch.long)
            for a, b in batch["bidirectional_spans"].tolist():
                if cu[e] <= a < cu[e + 1]:
                    types_[a - cu[e] : b - cu[e]] = 1
            assert types_.tolist() == want["token_type_ids"][0].tolist()
            n = want["pixel_values"].shape[0]
            assert torch.equal(batch["pixel_values"][blocks : blocks + n], want["pixel_values"])
            blocks += n
            seen += 1
    profile = get_profile("gemma3", **options)
    coco = [profile.image.crop_layout(*profile.image.plan(ImageRef(path=str(p)))) for p in coco_images[:2]]
    assert seen == 2 and sum(len(r["images"]) for r in rows) == (1 + 3) + 1 + sum(1 + r * c for r, c in coco)


def test_pan_and_scan_truncation_keeps_an_images_blocks_together(tmp_path) -> None:
    (tmp_path / "wide.png").write_bytes(_png(1000, 400))
    rec = {"messages": [{"role": "user", "content": "Hello there, " * 20}, {"role": "assistant", "content": "Hi."},
                        {"role": "user", "content": [{"type": "image", "image": "wide.png"}]},
                        {"role": "assistant", "content": "Noise."}]}
    (tmp_path / "d.jsonl").write_text(json.dumps(rec) + "\n")
    profile = PAS
    example = parse_record(rec, path=str(tmp_path / "d.jsonl"), line=1, base_dir=str(tmp_path))
    tok = load_tokenizer("gemma3")
    whole = Encoder(tok, profile).encode(example)
    assert [im.grid_thw[0] for im in whole.images] == [1, 2, 3, 4]
    for cut in (whole.images[0].offset + 10, whole.images[2].offset - 3, whole.images[3].offset + 255):
        enc = Encoder(tok, profile, max_length=cut, overlong="truncate").encode(example)
        assert enc.images == [] and len(enc.input_ids) < whole.images[0].offset  # none of its blocks kept
    plain = get_profile("gemma3", do_pan_and_scan=True, pan_and_scan_min_ratio_to_activate=3.0)
    assert len(Encoder(tok, plain).encode(example).images) == 1  # 2.5:1 is not elongated enough at 3.0


def test_pan_and_scan_needs_the_templates_image_rendering(tmp_path, tok) -> None:
    (tmp_path / "x.png").write_bytes(_png(1000, 400))
    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]},
                        {"role": "assistant", "content": "A."}]}
    template = "{% for m in messages %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image_soft_token>" \
               "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endfor %}"
    rec["messages"][1]["content"] = [{"type": "text", "text": "A."}]
    example = parse_record(rec, path="t.jsonl", line=1, base_dir=str(tmp_path))
    with pytest.raises(RecordError, match="needs the chat template to write an image as"):
        Encoder(tok, PAS, chat_template=template).encode(example)
