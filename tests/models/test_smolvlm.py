"""SmolVLM against transformers 5.23.0's own code: split counts from headers against ``SmolVLMImageProcessorPil`` (its
``get_number_of_image_patches`` and its real resize-and-split of the pixels), every example's ids against the
processor's text (``processing_smolvlm.get_image_prompt_string`` in place of each ``<image>``, tokenized), the
reader's pixels against the image processor's, and verify's tile checks. Packed == unpacked on the real model:
tests/models/test_conformance.py.

``SmolVLMProcessor`` itself cannot be built here (it needs ``num2words``, not a dependency), so the reference is
its parts: the chat template (``DEFAULT_CHAT_TEMPLATE``), the image processor's rows and cols, the module-level
``get_image_prompt_string`` it calls per image, and the tokenizer on the whole text, as ``__call__`` does. The
tokenizer is the builtin ``smolvlm`` STAND-IN (packer/models/smolvlm/tokenizers.py).
"""

from __future__ import annotations

import itertools
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import SmolVLMImageProcessorPil
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE, get_image_prompt_string

from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.smolvlm import prompt_string, tile_grid
from packer.models.smolvlm.tokenizers import SMOLVLM_FIRST_ID, SMOLVLM_TOKENS
from packer.report.verify import verify_build
from packer.train.collate import collate
from tests.models import family_checks as fc
from tests.models import released

# odd sizes: 1 px, extreme aspect ratios, exactly one and several tiles, just off them, beyond 4096
ODD_SIZES = [(1, 1), (2, 3), (3, 2), (1, 700), (700, 1), (5000, 10), (10, 5000), (383, 384), (384, 384),
             (385, 384), (768, 384), (384, 768), (1536, 1536), (1537, 1535), (1536, 1152), (1152, 1536),
             (640, 480), (99, 100), (4097, 3), (1000, 999)]
SETTINGS = {  # profile options -> what SmolVLMImageProcessorPil / the model config are given
    "smolvlm2": {},  # SmolVLM2-2.2B-Instruct: 384 px tiles, longest edge 1536, 81 tokens a tile
    "smolvlm-256m": {"tile_px": 512, "longest_edge": 2048, "patch_size": 16, "scale_factor": 4},  # 64 a tile
    "class-defaults": {"tile_px": 364, "longest_edge": 1456, "patch_size": 14, "scale_factor": 2},  # 169 a tile
    "fits-one-tile": {"longest_edge": 384},  # never split: the global view alone
    "no-splitting": {"do_image_splitting": False},
    "past-4096": {"tile_px": 1024, "longest_edge": 5000, "patch_size": 16, "scale_factor": 4},  # capped at 4096
}
SEQ = {"smolvlm2": 81, "smolvlm-256m": 64, "class-defaults": 169, "fits-one-tile": 81, "no-splitting": 81,
       "past-4096": 256}  # the checkpoints' processor image_seq_len (the class default is 169)


def _image_processor(options: dict) -> SmolVLMImageProcessorPil:
    """The PIL image processor as the checkpoint's preprocessor_config builds it (tests/models/released/smolvlm.json),
    with the sizes ``options`` set (the build's own, as a user passes them to the processor)."""
    kwargs: dict = {}
    if "longest_edge" in options:
        kwargs["size"] = {"longest_edge": options["longest_edge"]}
    if "tile_px" in options:
        kwargs["max_image_size"] = {"longest_edge": options["tile_px"]}
    if "do_image_splitting" in options:
        kwargs["do_image_splitting"] = options["do_image_splitting"]
    return released.image_processor("smolvlm", **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smolvlm")


@pytest.mark.slow
def test_tokenizer_is_the_stand_in(tokenizer) -> None:
    """Qwen2's BPE and first tokens, SmolVLM's special tokens after them, the names the processor reads, and a
    template that renders as DEFAULT_CHAT_TEMPLATE (a string content as its one text part)."""
    assert tokenizer("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE, nothing added
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    ids = tokenizer.convert_tokens_to_ids(list(SMOLVLM_TOKENS))
    assert ids == list(range(SMOLVLM_FIRST_ID, SMOLVLM_FIRST_ID + len(SMOLVLM_TOKENS)))
    assert "<row_6_col_6>" in SMOLVLM_TOKENS and len(SMOLVLM_TOKENS) == 4 + 36
    assert (tokenizer.fake_image_token, tokenizer.image_token, tokenizer.global_image_token,
            tokenizer.end_of_utterance_token) == ("<fake_token_around_image>", "<image>", "<global-img>",
                                                  "<end_of_utterance>")
    assert tokenizer.eos_token == "<end_of_utterance>" and tokenizer.bos_token is None
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}, {"type": "image"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Two cats."}]}]
    want = tokenizer.apply_chat_template(parts, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False,
                                         add_generation_prompt=True)
    assert tokenizer.apply_chat_template(parts, tokenize=False, add_generation_prompt=True) == want
    assert want == ("<|im_start|>System: Be brief.<end_of_utterance>\nUser:<image>What?<image><end_of_utterance>\n"
                    "Assistant: Two cats.<end_of_utterance>\nAssistant:")
    strings = [{"role": m["role"], "content": m["content"][0]["text"]} for m in (parts[0], parts[2])]
    assert tokenizer.apply_chat_template(strings, tokenize=False) == tokenizer.apply_chat_template(
        [parts[0], parts[2]], chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False)


def test_prompt_string_is_the_processors() -> None:
    for rows, cols in [(0, 0), *itertools.product(range(1, 7), repeat=2)]:
        for seq in (64, 81, 169):
            assert prompt_string(rows, cols, seq) == get_image_prompt_string(
                rows, cols, seq, fake_token_around_image="<fake_token_around_image>", image_token="<image>",
                global_image_token="<global-img>")


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_counts_from_headers_equal_the_processor_rule(setting: str, coco_images) -> None:
    """(rows, cols) from the header == SmolVLMImageProcessorPil.get_number_of_image_patches on every COCO-mini
    image and the odd sizes; num_tokens == the <image> tokens of the processor's prompt string; verify's
    grid_num_tokens gives them back from the stored grid; stats' tiles == the processor's patches."""
    profile = get_profile("smolvlm", **SETTINGS[setting])
    assert profile.image_seq_len == SEQ[setting]
    processor = _image_processor(SETTINGS[setting])
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES
    assert len(coco_images) > 200
    grids = []
    for w, h in sizes:
        patches, rows, cols = processor.get_number_of_image_patches(h, w)
        assert profile.image.tile_grid(w, h) == (rows, cols), (w, h)
        grid = profile.image.grid_thw(w, h)
        assert grid == (1, rows, cols) and profile.image.units(np.array([grid]))[1].tolist() == [max(patches, 1)]
        run = profile.image.run((w, h))
        assert run.text == get_image_prompt_string(rows, cols, SEQ[setting], "<fake_token_around_image>", "<image>",
                                                   "<global-img>")
        assert run.num_tokens == profile.image.num_tokens(w, h) == run.text.count("<image>") and run.grid == grid
        grids.append(grid)
    want = [profile.image.num_tokens(w, h) for w, h in sizes]
    assert profile.image.grid_num_tokens(np.array(grids)).tolist() == want


def test_grid_num_tokens_refuses_grids_no_image_gives() -> None:
    profile = get_profile("smolvlm")  # 4 tiles along the longest side, always split
    assert tile_grid(640, 480, tile_px=384, longest_edge=1536) == (3, 4) == profile.image.tile_grid(640, 480)
    grids = np.array([(1, 0, 0), (1, 3, 4), (1, 4, 1), (1, 4, 4), (1, 3, 3), (1, 5, 4), (2, 3, 4), (1, 0, 4)])
    assert profile.image.grid_num_tokens(grids).tolist() == [81, 13 * 81, 5 * 81, 17 * 81, -1, -1, -1, -1]
    assert get_profile("smolvlm", do_image_splitting=False).image.grid_num_tokens(grids).tolist() == [81] + [-1] * 7


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="multiple of scale_factor"):
        get_profile("smolvlm", scale_factor=4)  # 27 patches a side
    with pytest.raises(ConfigError, match="up to 6"):
        get_profile("smolvlm", longest_edge=8 * 384)
    assert get_profile("smolvlm", longest_edge=8 * 384, do_image_splitting=False).image.num_tokens(640, 480) == 81


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["smolvlm2", "smolvlm-256m", "fits-one-tile"])
def test_counts_equal_the_processors_pixels(setting: str, coco_images) -> None:
    """The real resize-and-split of the pixels (``rows``/``cols`` and tiles of pixel_values) on one COCO image
    per distinct split and every odd size; every tile tile_px square, the mask all ones."""
    profile = get_profile("smolvlm", **SETTINGS[setting])
    processor = _image_processor(SETTINGS[setting])
    coco = {profile.image.grid_thw(*profile.image.plan(ImageRef(path=str(p)))): ImageRef(path=str(p)) for p in coco_images}
    refs = list(coco.values()) + [ImageRef(data=fc.png(w, h, seed=i)) for i, (w, h) in enumerate(ODD_SIZES)]
    for ref in refs:
        image = load_image(ref)
        w, h = image.size
        assert profile.image.plan(ref) == (w, h)
        out = processor(images=[[image]], return_row_col_info=True, return_tensors="np")
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        assert profile.image.grid_thw(w, h) == (1, rows, cols), (w, h)
        t = profile.tile_px
        assert out["pixel_values"].shape == (1, rows * cols + 1, 3, t, t)
        assert out["pixel_attention_mask"].all()


def _processor_ids(path: list[dict], images: list[Image.Image], tokenizer, processor, seq: int) -> list[int]:
    """SmolVLMProcessor's input_ids for one path: its messages rendered by DEFAULT_CHAT_TEMPLATE (content as
    parts), each <image> replaced by get_image_prompt_string of the image processor's rows and cols, tokenized."""
    msgs = [{"role": m["role"], "content": [c if isinstance(c, dict) and c.get("type") != "image" else
                                            {"type": "image"} for c in m["content"]]
             if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]} for m in path]
    text = tokenizer.apply_chat_template(msgs, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False)
    pieces = text.split(tokenizer.image_token)
    assert len(pieces) == len(images) + 1
    if images:
        split = processor(images=[images], return_row_col_info=True)
        prompts = [get_image_prompt_string(r, c, seq, fake_token_around_image=tokenizer.fake_image_token,
                                           image_token=tokenizer.image_token,
                                           global_image_token=tokenizer.global_image_token)
                   for r, c in zip(split["rows"][0], split["cols"][0], strict=True)]
        text = "".join(p + q for p, q in zip(pieces, prompts, strict=False)) + pieces[-1]
    return tokenizer(text).input_ids


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images):
    """A build over a COCO image, odd sizes, two images in one turn, a tree with its image in the prefix and a
    nested branch, an image in a later turn, a LLaVA record and text, in rows of several examples."""
    root = tmp_path_factory.mktemp("smolvlm")
    fc.write_images(root, coco_images[0], {"wide.png": (900, 300), "line.png": (1, 700), "tile.png": (384, 384),
                                        "small.png": (40, 30)})
    return fc.build_records(root, fc.image_records(), profile="smolvlm", max_length=4096)


@pytest.mark.slow
def test_expansion_equals_the_processor(built, tokenizer) -> None:
    """Every root-to-leaf path of every example == SmolVLMProcessor's input_ids for that path's conversation,
    and the build verifies (tiles, layout, counts) against its input."""
    assert built["result"].manifest["totals"]["rejected"] == 0
    assert verify_build(built["root"] / "out", inputs=[str(built["data"])]).ok
    processor = _image_processor({})
    rows, root = built["rows"], built["root"]
    assert len(rows) > 1 and any(len(r["example_ids"]) > 1 for r in rows)
    seen = 0
    paths = partial(fc.chat_paths, text_parts=True)  # LLaVA turns as parts, as DEFAULT_CHAT_TEMPLATE takes them
    for row, example_id, record, positions, path in fc.each_path(rows, built["records"], paths):
        names = [c["image"] for m in path if isinstance(m["content"], list) for c in m["content"]
                 if c.get("type") == "image" and "image" in c]
        if "conversations" in record:
            names = [record["image"]]
        images = [load_image(ImageRef(path=str(root / n))) for n in names]
        want = _processor_ids(path, images, tokenizer, processor, seq=81)
        assert row["input_ids"][positions].tolist() == want, (example_id, path)
        seen += 1
    assert seen == 1 + 1 + 3 + 1 + 1 + 1


@pytest.mark.slow
def test_reader_equals_the_image_processor(built) -> None:
    """collate of several rows: pixel_values and pixel_attention_mask == SmolVLMImageProcessorPil on the rows'
    images as one sample (token order), and each image's tiles == its stored grid's."""
    rows, root = built["rows"], built["root"]
    batch = collate(rows)
    images = [im for r in rows for im in r["images"]]
    decoded = [load_image(ImageRef(path=str(root / Path(im["source"]).name))) for im in images]
    want = _image_processor({})(images=[decoded], return_tensors="pt")
    for key in ("pixel_values", "pixel_attention_mask"):
        assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
    profile = get_profile("smolvlm")
    tiles = profile.image.units(np.array([(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images]))[1]
    assert batch["pixel_values"].shape[:2] == (1, int(tiles.sum()))
    # the proof cuts the batch per image the same way: its tiles are the <image> runs from its offset
    token_ids = {"<image>": load_tokenizer("smolvlm").convert_tokens_to_ids("<image>")}
    table = profile.proof().image_table(batch, token_ids)
    assert [n for _, n in table] == tiles.tolist()
    assert [off for off, _ in table] == batch["image_offsets"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["tile token", "stray image token", "rows and cols swapped", "grid", "offset"])
def test_verify_checks_every_tile(built, tmp_path, tokenizer, fault) -> None:
    """A broken tile, a stray <image>, a grid that is not the run's layout (rows and cols swapped: the same
    count), a grid no image gives, or an entry not at its run: verify says so."""
    out = tmp_path / "out"
    shutil.copytree(built["root"] / "out", out)
    text_id = tokenizer("x").input_ids[0]
    image_id = tokenizer.convert_tokens_to_ids("<image>")

    def change(row: dict, im: dict) -> None:
        if fault == "tile token":  # in the first tile, after <fake_token_around_image> and <row_1_col_1>
            row["input_ids"][im["offset"] + 2 + 40] = text_id
        else:  # the row's first token is <|im_start|>
            fc.break_image(row, im, fault, image_id)

    fc.rewrite_first(out, fc.oblong_image, change)
    report = verify_build(out)
    assert not report.ok
    # a tile split in two shifts every later tile onto another run: the spans check fails first
    want = {"tile token": "image spans", "stray image token": "image tokens", "rows and cols swapped": "image spans",
            "grid": "image grid", "offset": "image spans"}[fault]
    assert {check for _, check in report.counts} == {want}, report.lines()
