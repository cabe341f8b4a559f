"""Gemma 3 against transformers 5.23.0's ``Gemma3Processor`` (PIL image processor, 896 px, no pan-and-scan):
256 tokens per image for every COCO-mini image, the processor's input_ids (begin/end-of-image tokens and the
"\\n\\n" around them) and token_type_ids, and its pixel values. Packed == unpacked on the model is
tests/train/test_gemma3_equivalence.py.

Tokenizer: the builtin ``gemma3`` STAND-IN (Qwen2's ranks + Gemma 3's special tokens; Gemma's own
SentencePiece model is on no registry). The processor runs the same tokenizer on the text Gemma 3's own chat
template renders (``<start_of_image>`` per image), so what is compared is the image expansion.
"""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from PIL import Image

from packer.core.types import ImageRef
from packer.encode.encoder import Encoder
from packer.encode.tokenizers import load_tokenizer
from packer.formats import parse_record
from packer.models import get_profile

EXPANDED = "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"  # the builtin template's image part


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("gemma3")


@pytest.fixture(scope="module")
def processor(tok):
    # google/gemma-3-*-it preprocessor_config.json: 896x896, image_seq_length 256, pan-and-scan off
    image_processor = transformers.Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    return transformers.Gemma3Processor(image_processor=image_processor, tokenizer=tok, image_seq_length=256)


def test_every_coco_image_is_256_tokens(coco_images, processor) -> None:
    profile = get_profile("gemma3")
    sizes = [profile.image_size(ImageRef(path=str(p))) for p in coco_images]
    want = processor._get_num_multimodal_tokens(image_sizes=[(h, w) for w, h in sizes])["num_image_tokens"]
    assert [profile.num_tokens(w, h) for w, h in sizes] == want == [256] * len(sizes)
    grids = np.array([profile.grid_thw(w, h) for w, h in sizes + [(1, 1), (5000, 3)]])
    assert profile.grid_num_tokens(grids).tolist() == [256] * (len(sizes) + 2)
    assert profile.grid_num_tokens(np.array([(1, 16, 8), (2, 16, 16)])).tolist() == [-1, -1]
    assert profile.bidirectional_images and not profile.mrope


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
    pixels = get_profile("gemma3").pixel_values([ImageRef(path=str(p)) for p in files])["pixel_values"]
    assert np.array_equal(pixels.numpy(), out["pixel_values"])
    assert isinstance(get_profile("gemma3").image_processor(), transformers.Gemma3ImageProcessorPil)
