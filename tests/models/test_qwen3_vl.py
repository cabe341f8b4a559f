"""Qwen3-VL: grids and token counts against transformers' image processor configured as the released
checkpoints are (every COCO-mini image, odd sizes), positions against ``Qwen3VLModel.get_rope_index`` (text,
images, every root-to-leaf path of trees), and the ``qwen3-vl`` builtin tokenizer's ids and template."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import Qwen3VLConfig, Qwen3VLModel
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

from packer.core.types import ImageRef
from packer.encode.templates import ChatTemplate, hf_message
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.models import get_profile
from packer.models.qwen_vl.qwen3 import Qwen3VLProfile
from tests.conftest import COCO
from tests.models import released
from tests.models.test_mrope import build_tree, image, linear_cases, paths, random_image_tree, text

IMAGE_FILES = sorted(p for d in ("train2017", "val2017", "unlabelled") for p in (COCO / d).glob("*.jpg"))
IMAGE_PAD = 151655


@pytest.fixture(scope="module")
def processor():
    assert IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_vl"]["pil"] == "Qwen2VLImageProcessorPil"
    return released.image_processor("qwen3-vl")


def _hf_grids(processor, images: list[Image.Image]) -> list[tuple[int, int, int]]:
    # Normalization does not change shapes; skipping it saves a third of the processor's time.
    out = processor(images=images, return_tensors="np", do_rescale=False, do_normalize=False)
    return [tuple(int(x) for x in g) for g in out["image_grid_thw"]]


@pytest.mark.slow
def test_every_coco_image_matches_processor(processor) -> None:
    """Every image's header-only grid and count equal the processor's, run on one decoded image per size
    (the grid depends on the size alone: 239 images, 83 sizes), and its get_number_of_image_patches."""
    profile = get_profile("qwen3-vl")
    assert isinstance(profile.reader().image_processor(), transformers.Qwen2VLImageProcessorPil)
    by_size: dict[tuple[int, int], list[ImageRef]] = {}
    for p in IMAGE_FILES:
        ref = ImageRef(path=str(p))
        by_size.setdefault(profile.image.plan(ref), []).append(ref)
    sizes = list(by_size)
    decoded = [Image.open(by_size[s][0].path).convert("RGB") for s in sizes]
    assert [im.size for im in decoded] == sizes
    hf = _hf_grids(processor, decoded)
    for (w, h), grid in zip(sizes, hf, strict=True):
        for ref in by_size[(w, h)]:
            assert profile.image.grid_thw(*profile.image.plan(ref)) == grid
        assert profile.image.num_tokens(w, h) == grid[0] * grid[1] * grid[2] // 4
        assert processor.get_number_of_image_patches(h, w, {}) == grid[0] * grid[1] * grid[2]
    assert profile.image.num_tokens(640, 480) == 300  # the module docstring's worked example


@pytest.mark.parametrize("size", [(1, 1), (31, 33), (32, 32), (255, 257), (1000, 5), (5, 999), (4096, 4096),
                                  (4097, 4095), (6000, 4000), (8000, 45), (300, 60000)])
def test_odd_sizes_match_processor(processor, size) -> None:
    w, h = size
    profile = get_profile("qwen3-vl")
    if max(w, h) / min(w, h) > 200:
        with pytest.raises(RecordError, match="aspect ratio"):
            profile.image.grid_thw(w, h)
        return
    t, gh, gw = profile.image.grid_thw(w, h)
    assert processor.get_number_of_image_patches(h, w, {}) == t * gh * gw
    if w * h <= 1_000_000:  # a real processor run where it is cheap
        assert _hf_grids(processor, [Image.new("RGB", (w, h))]) == [(t, gh, gw)]


def test_pixel_values_match_processor_exactly(processor) -> None:
    profile = get_profile("qwen3-vl")
    refs = [ImageRef(path=str(p)) for p in IMAGE_FILES[:2]]
    out = profile.reader().pixel_values(refs)
    expected = processor(images=[Image.open(r.path).convert("RGB") for r in refs], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert torch.equal(out["pixel_values"], expected["pixel_values"])
    assert out["pixel_values"].shape[1] == 3 * 2 * 16 * 16


def test_pixel_overrides() -> None:
    profile = get_profile("qwen3-vl", min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)
    assert isinstance(profile, Qwen3VLProfile)
    assert profile.image.num_tokens(640, 480) == 12  # 96 x 128 px: 3 x 4 merged tokens
    hf = released.image_processor("qwen3-vl", min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)
    assert hf.get_number_of_image_patches(480, 640, {}) == 12 * 4


# ---- positions against get_rope_index ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Qwen3VLModel:
    """A tiny real Qwen3VLModel; get_rope_index reads its config only."""
    torch.manual_seed(0)
    text_config = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=8,
                       rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1],
                                        "mrope_interleaved": True})
    vision_config = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16,
                         num_position_embeddings=16, deepstack_visual_indexes=[0])
    m = Qwen3VLModel(Qwen3VLConfig(text_config=text_config, vision_config=vision_config))
    assert (m.config.image_token_id, m.config.vision_config.spatial_merge_size) == (IMAGE_PAD, 2)
    return m


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3-vl")


def hf_rope(model, ids: list[int], grids: list[tuple[int, int, int]]) -> np.ndarray:
    """Qwen3VLModel.get_rope_index of one unpadded sequence: (3, L)."""
    input_ids = torch.tensor([ids])  # (1, L)
    mm = (input_ids == IMAGE_PAD).int()  # the processor's mm_token_type_ids: 1 for image tokens
    grid = torch.tensor(grids, dtype=torch.long) if grids else None
    pos, _ = model.get_rope_index(input_ids, mm, image_grid_thw=grid)  # (3, 1, L)
    return pos[:, 0].numpy()


def _positions(tok, ids, offsets, parents, grids) -> np.ndarray:
    profile = get_profile("qwen3-vl")
    ids = np.asarray(ids)
    from packer.core.tree import tree_position_ids

    token_ids = {"image_token": tok.convert_tokens_to_ids("<|image_pad|>"), "vision_start": None, "vision_end": None}
    return profile.positions.extra(
        ids, tree_position_ids(len(ids), offsets, parents), offsets, parents, grids, token_ids=token_ids
    )


def test_linear_matches_get_rope_index(model, tok) -> None:
    assert tok.convert_tokens_to_ids("<|image_pad|>") == IMAGE_PAD
    one, root = np.array([0], np.int32), np.array([-1], np.int32)
    for name, (ids, grids) in linear_cases(tok).items():
        got = _positions(tok, ids, one, root, grids)
        assert got.dtype == np.int32 and got.shape == (3, len(ids)), name
        np.testing.assert_array_equal(got, hf_rope(model, ids, grids), err_msg=name)


def _check_tree(model, tok, ids, offsets, parents, grids) -> None:
    got = _positions(tok, ids, offsets, parents, grids)
    ends = np.append(offsets[1:], len(ids))
    starts_of = [np.flatnonzero(np.diff(np.concatenate([[0], ids[o:e] == IMAGE_PAD, [0]]).astype(int)) == 1)
                 for o, e in zip(offsets, ends, strict=True)]
    node_grids, k = [], 0
    for s in starts_of:  # the images of each node, in token order
        node_grids.append(grids[k : k + len(s)])
        k += len(s)
    for path in paths(parents):
        index = np.concatenate([np.arange(offsets[n], ends[n]) for n in path])
        expected = hf_rope(model, ids[index].tolist(), [g for n in path for g in node_grids[n]])
        np.testing.assert_array_equal(got[:, index], expected, err_msg=f"path {path}")


def test_tree_matches_each_path_alone(model, tok) -> None:
    g1, g2, g3 = (1, 8, 10), (1, 6, 4), (1, 2, 2)
    nodes = [
        (-1, text(tok, "<|im_start|>user\n") + image(g1), [g1]),
        (0, text(tok, "Caption it.<|im_end|>\n<|im_start|>assistant\nA dog.<|im_end|>\n"), []),
        (1, text(tok, "<|im_start|>user\nAnd this?") + image(g2) + text(tok, "<|im_end|>\n"), [g2]),
        (2, text(tok, "<|im_start|>assistant\nA cat."), []),
        (2, image(g3), [g3]),  # a node that is only an image
        (1, text(tok, "!"), []),
        (0, image(g2) + text(tok, "Count.<|im_end|>\n<|im_start|>assistant\nTwo."), [g2]),
    ]
    _check_tree(model, tok, *build_tree(nodes))


def test_random_trees_match_get_rope_index(model, tok) -> None:
    rng = np.random.default_rng(3)
    words = [text(tok, w) for w in ("Hi.", " the dog", "<|im_end|>\n", "<|im_start|>assistant\n", "<think>", " 42")]
    for _ in range(10):
        _check_tree(model, tok, *build_tree(random_image_tree(rng, words)))


# ---- tokenizer and template ------------------------------------------------------------------------------


def test_tokenizer_ids(tok) -> None:
    """Qwen3's added tokens at their real ids; the vision ids are the ones Qwen3VLConfig defaults to."""
    config = Qwen3VLConfig()
    assert tok.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]) == [
        config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id]
    added = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|file_sep|>",
             "<tool_response>", "</tool_response>", "<think>", "</think>"]
    assert tok.convert_tokens_to_ids(added) == [151643, 151644, 151645, 151657, 151658, 151664,
                                                 151665, 151666, 151667, 151668]
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE, which Qwen3 kept
    assert get_profile("qwen3-vl").default_tokenizer == "qwen3-vl"


def test_template_renders_instruct_format(tok) -> None:
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A cat."}]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"  # no default system prompt, no <think>
    )
    video = [{"role": "user", "content": [{"type": "video", "video": "a.mp4"}, {"type": "text", "text": "Hm?"}]}]
    assert tok.apply_chat_template(video, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Hm?<|im_end|>\n<|im_start|>assistant\n"
    )
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {}}}]
    calls = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Zoom in."},
             {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "zoom", "arguments": {"x": 1}}}]},
             {"role": "tool", "content": "done"}]
    out = tok.apply_chat_template(calls, tools=tools, tokenize=False)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n' in out
    assert out.endswith("<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n")


def test_template_content_spans(tok) -> None:
    """packer locates each message's content in the Qwen3-VL rendering (markers survive the macro)."""
    from packer.core.types import Message

    template = ChatTemplate(tok.chat_template, special_tokens={}, images=True)
    conv = [Message("user", [ImageRef(path="x.jpg"), " Describe. "]), Message("assistant", ["<think>a</think> b"])]
    text_, spans = template.locate(conv)
    assert text_ == template.render([hf_message(m, marked=False) for m in conv])
    assert text_[spans[1][0] : spans[1][1]] == "<think>a</think> b"
