"""Llama 4 against transformers 5.23.0's own code and Meta's: the builtin tokenizer against ``llama_models``' Llama 4
``Tokenizer`` (tiktoken) and transformers' ``Llama4Config`` ids, canvases from headers against
``image_processing_llama4``'s ``get_best_fit`` (every COCO-mini image, odd sizes, a sweep) and its real pixels, every
example's ids against ``Llama4Processor``'s ``input_ids`` for that path's conversation, the reader's pixels against
the image processor's, verify's checks of the runs, and packed == unpacked on ``Llama4ForConditionalGeneration`` with
tiled images, trees and a chunk shorter than the rows (and ``scripts/check_equivalence.py --model llama4``).

transformers ships no PIL backend for Llama 4's image processor, and its torchvision one imports torchvision at module
level: ``packer.models.llama4.processor`` imports it with torchvision's three calls done in torch (its docstring);
``Llama4Processor`` itself imports without torchvision and is used as it is, with that image processor and the
builtin tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.image_utils import SizeDict
from transformers.models.llama4.processing_llama4 import Llama4Processor
from transformers.models.llama4.processing_llama4 import chat_template as PROCESSOR_TEMPLATE

import packer.models.registry
from packer.config import BuildConfig
from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError
from packer.media.images import load_image
from packer.models import get_profile, register_profile
from packer.models.llama4 import Llama4Profile, canvas, image_tokens, supported_canvases
from packer.models.llama4.processor import _llama4_module, image_processor_class, resize_image
from packer.models.llama4.tokenizers import LLAMA4_CHAT_TEMPLATE, LLAMA4_SPECIAL_TOKENS
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.models import family_checks as fc
from tests.models import released

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_equivalence", REPO / "scripts" / "check_equivalence.py")
ce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ce)

# odd sizes: 1 px, extreme aspect ratios, exactly one tile and just off it, exact canvases and just past them,
# beyond the 16-tile canvases, ties between canvases of equal scale
ODD_SIZES = [(1, 1), (2, 3), (3, 2), (1, 700), (700, 1), (335, 336), (336, 336), (337, 336), (336, 337),
             (672, 336), (336, 672), (673, 336), (1344, 1344), (1345, 1344), (5376, 336), (336, 5376), (5000, 10),
             (10, 5000), (640, 480), (99, 100), (1000, 999), (4097, 3), (168, 168), (2016, 673)]
SETTINGS = {  # profile options -> Llama4ImageProcessor settings
    "scout": {},  # 336 px tiles, up to 16, resize least
    "max-canvas": {"resize_to_max_canvas": True},
    "small-tiles": {"tile_px": 56, "max_patches": 6},  # 4 tokens a tile
    "one-tile": {"max_patches": 1},
}


def _image_processor(profile: Llama4Profile):
    """The released files' image processor (tests/models/released/llama4.json) with the settings ``profile`` changes
    from the released defaults (the build's own options), as a user passes them to the processor."""
    default, kwargs = get_profile("llama4"), {}
    if profile.tile_px != default.tile_px:
        kwargs["size"] = {"height": profile.tile_px, "width": profile.tile_px}
    for key in ("max_patches", "resize_to_max_canvas"):
        if getattr(profile, key) != getattr(default, key):
            kwargs[key] = getattr(profile, key)
    return released.image_processor("llama4", **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("llama4")


@pytest.fixture(scope="module")
def processor(tokenizer):
    """transformers' Llama4Processor as Llama-4-Scout's processor_config builds it (patch 14, pixel shuffle 0.5)."""
    return Llama4Processor(image_processor=_image_processor(get_profile("llama4")), tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_is_llama4s(tokenizer) -> None:
    """llama_models' Llama 4 Tokenizer (tiktoken over the same ranks and pattern) gives the same ids; the special
    tokens sit at its ids; Llama4Config's image ids and vocabulary size are the tokenizer's."""
    from llama_models.llama4.tokenizer import Tokenizer
    from transformers import Llama4Config, Llama4TextConfig

    meta = Tokenizer.get_instance()
    assert meta.special_tokens == {t: 200000 + i for i, t in enumerate(LLAMA4_SPECIAL_TOKENS)}
    assert len(tokenizer) == meta.n_words == Llama4TextConfig().vocab_size == 202048
    assert tokenizer.convert_tokens_to_ids(list(LLAMA4_SPECIAL_TOKENS)) == list(range(200000, 202048))
    texts = ["Hello world!", "The quick brown fox  jumps\n\nover 12345 lazy dogs.", "I'm here, you're THERE; it's 3.14!",
             "Ünïcödé — 日本語のテキスト 🤖", "CamelCaseWords ALLCAPS path/to/file.py\r\n  indented\ttab", "   x   ",
             "don'T WON'T it'LL", "1234567 12,345.678", "a" * 300, "\n\n\n  \n"]
    for text in texts:
        assert tokenizer(text, add_special_tokens=False).input_ids == meta.encode(text, bos=False, eos=False), text
    config = Llama4Config()
    assert tokenizer.convert_tokens_to_ids(["<|image_start|>", "<|image_end|>", "<|patch|>"]) == [
        config.boi_token_index, config.eoi_token_index, config.image_token_index]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|begin_of_text|>", "<|eot|>", "<|finetune_right_pad|>")
    assert tokenizer.pad_token_id == meta.pad_id and tokenizer.eos_token_id == meta.eot_id
    # special tokens added: bos first, as transformers' Llama4Converter's post-processor adds it (packer never asks
    # for them; the template writes bos)
    assert tokenizer("Hi").input_ids == meta.encode("Hi", bos=True, eos=False)


def test_chat_template_is_the_processors(tokenizer) -> None:
    assert LLAMA4_CHAT_TEMPLATE == PROCESSOR_TEMPLATE == tokenizer.chat_template
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": "A cat."}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False) == (
        "<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|><|header_start|>user<|header_end|>"
        "\n\n<|image|>What?<|eot|><|header_start|>assistant<|header_end|>\n\nA cat.<|eot|>")


# ---------------------------------------------------------------------------------------------- counts


def test_canvases_are_the_processors() -> None:
    module = _llama4_module()
    for max_patches in (1, 2, 4, 6, 9, 16, 32):
        for tile in (28, 56, 336):
            want = module.find_supported_resolutions.__wrapped__(max_patches, SizeDict(height=tile, width=tile))
            assert list(supported_canvases(max_patches, tile)) == [tuple(x) for x in want]


def test_image_run_is_the_processors(processor) -> None:
    """``image_tokens`` == Llama4Processor._prompt_split_image for every canvas of up to 16 tiles."""
    for rows in range(1, 17):
        for cols in range(1, 17 // rows + 1):
            for per_tile in (1, 4, 144):
                want = processor._prompt_split_image((rows, cols), per_tile)
                assert "".join(image_tokens(rows, cols, per_tile)) == want, (rows, cols, per_tile)


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_counts_from_headers_equal_the_processor_rule(setting: str, coco_images, processor) -> None:
    """The canvas from the header == get_best_fit (float32 torch, as the processor calls it) on every COCO-mini image,
    the odd sizes and a sweep; num_tokens == the <|patch|> tokens of the processor's run; verify's grid_num_tokens
    and stats' tiles from the stored grid."""
    module = _llama4_module()
    profile = get_profile("llama4", **SETTINGS[setting])
    possible = torch.tensor(module.find_supported_resolutions.__wrapped__(
        profile.max_patches, SizeDict(height=profile.tile_px, width=profile.tile_px)))
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES
    assert len(coco_images) > 200
    sizes += [(w, h) for w in range(1, 1400, 37) for h in range(1, 1400, 41)]
    grids, want = [], []
    for w, h in sizes:
        best = module.get_best_fit((h, w), possible, resize_to_max_canvas=profile.resize_to_max_canvas)
        rows, cols = int(best[0]) // profile.tile_px, int(best[1]) // profile.tile_px
        assert profile.image.tile_grid(w, h) == (rows, cols), (w, h)
        grid = profile.image.grid_thw(w, h)
        run = profile.image.run((w, h))
        assert run.grid == grid == (1, rows, cols)
        assert run.num_tokens == profile.image.num_tokens(w, h) == run.tokens.count("<|patch|>")
        if len(grids) < 300:  # the run as the processor writes it
            assert "".join(run.tokens) == processor._prompt_split_image((rows, cols), profile.tokens_per_tile)
        grids.append(grid)
        want.append(run.num_tokens)
    assert profile.image.grid_num_tokens(np.array(grids)).tolist() == want
    n = np.array([r * c for _, r, c in grids])
    assert profile.image.units(np.array(grids))[1].tolist() == (n + (n > 1)).tolist()


def test_grid_num_tokens_refuses_grids_no_image_gives() -> None:
    profile = get_profile("llama4")
    assert profile.tokens_per_tile == 144 and canvas(640, 480, tile_px=336, max_patches=16,
                                                      resize_to_max_canvas=False) == (672, 672)
    grids = np.array([(1, 1, 1), (1, 2, 2), (1, 4, 4), (1, 1, 16), (1, 3, 6), (1, 0, 0), (2, 1, 1), (1, 0, 3),
                      (0, 1, 1)])
    assert profile.image.grid_num_tokens(grids).tolist() == [144, 5 * 144, 17 * 144, 17 * 144, -1, 1, -1, -1, -1]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="pixel shuffle"):
        get_profile("llama4", tile_px=42)  # 3 patches a side: no whole token after a 0.5 shuffle
    with pytest.raises(ConfigError, match="only apply to profiles"):
        get_profile("llama4", do_image_splitting=False)
    assert get_profile("llama4", tile_px=28).tokens_per_tile == 1


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["scout", "small-tiles"])
def test_counts_equal_the_processors_pixels(setting: str, coco_images) -> None:
    """The image processor's aspect_ratios and tiles (pixel_values) on one COCO image per distinct canvas and every
    odd size: the header's grid, rows * cols tiles + the global one when several."""
    profile = get_profile("llama4", **SETTINGS[setting])
    image_processor = _image_processor(profile)
    coco = {profile.image.grid_thw(*profile.image.plan(ImageRef(path=str(p)))): ImageRef(path=str(p)) for p in coco_images}
    refs = list(coco.values()) + [ImageRef(data=fc.png(w, h, seed=i)) for i, (w, h) in enumerate(ODD_SIZES)
                                  if w * h < 3_000_000]
    for ref in refs:
        image = load_image(ref)
        w, h = image.size
        out = image_processor(images=[image], return_tensors="pt")
        rows, cols = out["aspect_ratios"][0].tolist()
        assert profile.image.grid_thw(w, h) == (1, rows, cols), (w, h)
        t = profile.tile_px
        assert out["pixel_values"].shape == (profile.image.units(np.array([(1, rows, cols)]))[1][0], 3, t, t)
        assert out["pixel_values"].dtype == torch.bfloat16


def test_the_standin_is_gone_after_the_import() -> None:
    """Importing Llama 4's image processor leaves no torchvision behind: nothing else sees the stand-in."""
    image_processor_class()
    assert "torchvision" not in sys.modules or importlib.util.find_spec("torchvision") is not None
    from transformers.utils import is_torchvision_available

    assert is_torchvision_available() == (importlib.util.find_spec("torchvision") is not None)


def test_resize_follows_torchvisions_paths() -> None:
    """uint8 bilinear: torch's native uint8 kernel with AVX2/AVX-512 (this machine's path), else float32 rounded back;
    same size returns the input; float input interpolates as it is."""
    x = torch.randint(0, 256, (2, 3, 37, 53), dtype=torch.uint8)
    native = torch.nn.functional.interpolate(x, size=[20, 31], mode="bilinear", align_corners=False, antialias=True)
    via_float = torch.nn.functional.interpolate(x.float(), size=[20, 31], mode="bilinear", align_corners=False,
                                                antialias=True).round_().to(torch.uint8)
    want = native if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else via_float
    assert torch.equal(resize_image(x, (20, 31)), want)
    assert resize_image(x, (37, 53)) is x
    xf = x.float()
    assert torch.equal(resize_image(xf, (20, 31)), torch.nn.functional.interpolate(
        xf, size=[20, 31], mode="bilinear", align_corners=False, antialias=True))


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="needs torchvision")
def test_same_pixels_as_torchvision(coco_images) -> None:
    """With torchvision installed: the unmodified Llama4ImageProcessor gives the reader's image processor's pixels."""
    module = _llama4_module()
    images = [load_image(ImageRef(path=str(p))) for p in coco_images[:8]] + [load_image(ImageRef(data=fc.png(40, 700)))]
    want = module.Llama4ImageProcessor()(images=images, return_tensors="pt")["pixel_values"]
    got = image_processor_class()()(images=images, return_tensors="pt")["pixel_values"]
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------- ids, reader, verify


def _records() -> list[dict]:
    return [*fc.image_records(later="tall.png"),
            {"text": "A plain document, long enough to carry some loss on every token of it."}]


def _write_images(root: Path, coco_images: list[Path]) -> None:
    fc.write_images(root, coco_images[0], {"wide.png": (900, 300), "line.png": (1, 700), "tile.png": (336, 336),
                                        "small.png": (40, 30), "tall.png": (300, 1300)})


def _paths(record: dict) -> list:
    """A document's one path is the record itself; a chat's are its root-to-leaf conversations."""
    return [record] if "text" in record else fc.chat_paths(record)


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images):
    """A build over a COCO image, odd sizes (1 to 10 tiles), two images in one turn, a tree with its image in the
    prefix and an image in a nested branch, an image in a later turn, a LLaVA record, a chat and a document."""
    root = tmp_path_factory.mktemp("llama4")
    _write_images(root, coco_images)
    return fc.build_records(root, _records(), profile="llama4", max_length=2048)


@pytest.mark.slow
def test_ids_equal_the_processor(built, tokenizer, processor) -> None:
    """Every root-to-leaf path of every example == Llama4Processor's input_ids for that path's conversation (the
    chat template, each <|image|> replaced by its tiles' run), and the build verifies against its input."""
    assert built["result"].manifest["totals"]["rejected"] == 0
    assert verify_build(built["root"] / "out", inputs=[str(built["data"])]).ok
    rows, root = built["rows"], built["root"]
    assert len(rows) > 1 and any(len(r["example_ids"]) > 1 for r in rows)
    grids = {(im["grid_h"], im["grid_w"]) for r in rows for im in r["images"]}
    assert {(1, 1), (2, 2)} <= grids and len(grids) >= 4  # one tile, square and elongated canvases
    seen = 0
    for row, example_id, record, positions, path in fc.each_path(rows, built["records"], _paths):
        if "text" in record:
            want = tokenizer("<|begin_of_text|>" + record["text"] + "<|eot|>", add_special_tokens=False).input_ids
            assert row["input_ids"][positions].tolist() == want
            seen += 1
            continue
        names = [c["image"] for m in path if isinstance(m["content"], list) for c in m["content"]
                 if c.get("type") == "image" and "image" in c] or ([record["image"]] if "image" in record else [])
        msgs = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
                 [{"type": "image"} if c["type"] == "image" else c for c in m["content"]]} for m in path]
        text = tokenizer.apply_chat_template(msgs, tokenize=False)
        images = [load_image(ImageRef(path=str(root / n))) for n in names]
        # the rendering holds its bos: no special tokens added (as the processor's apply_chat_template)
        want = processor(text=text, images=images or None, add_special_tokens=False)["input_ids"]
        assert row["input_ids"][positions].tolist() == want[0], (example_id, path)
        seen += 1
    assert seen == 1 + 1 + 3 + 1 + 1 + 1 + 1


@pytest.mark.slow
def test_reader_equals_the_image_processor(built) -> None:
    """collate of several rows: pixel_values == the image processor on the rows' images in token order (its bfloat16
    values, bit for bit), and each image's tiles are its stored grid's; the proof cuts them the same way."""
    rows, root = built["rows"], built["root"]
    batch = collate(rows)
    images = [im for r in rows for im in r["images"]]
    decoded = [load_image(ImageRef(path=str(root / Path(im["source"]).name))) for im in images]
    want = _image_processor(get_profile("llama4"))(images=decoded, return_tensors="pt")["pixel_values"]
    assert want.dtype == torch.bfloat16 and batch["pixel_values"].dtype == torch.float32
    assert torch.equal(batch["pixel_values"].to(torch.bfloat16), want)
    assert torch.equal(batch["pixel_values"], want.float())
    profile = get_profile("llama4")
    tiles = profile.image.units(np.array([(im["grid_t"], im["grid_h"], im["grid_w"]) for im in images]))[1]
    assert batch["pixel_values"].shape[0] == int(tiles.sum())
    token_ids = {"<|patch|>": load_tokenizer("llama4").convert_tokens_to_ids("<|patch|>")}
    table = profile.proof().image_table(batch, token_ids)
    assert [n for _, n in table] == tiles.tolist()
    assert [off for off, _ in table] == batch["image_offsets"].tolist()


FAULTS = {  # fault -> what verify reports
    "patch token": "image spans", "separator": "image spans", "stray patch": "image spans",
    "stray image token": "image tokens", "rows and cols swapped": "image spans", "grid": "image grid",
    "marker grid": "image grid", "offset": "image spans",
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_verify_checks_every_run(built, tmp_path, tokenizer, fault) -> None:
    """A tile's patch or a separator overwritten, a stray <|patch|> or <|image|>, rows and cols swapped (the same
    count), a grid no image gives, the marker's own grid stored, an entry off its run: verify says so."""
    out = tmp_path / "out"
    shutil.copytree(built["root"] / "out", out)
    text_id = tokenizer("x", add_special_tokens=False).input_ids[0]
    patch_id, image_id = tokenizer.convert_tokens_to_ids(["<|patch|>", "<|image|>"])

    def change(row: dict, im: dict) -> None:
        if fault == "patch token":  # in the first tile
            row["input_ids"][im["offset"] + 1 + 40] = text_id
        elif fault == "separator":  # the first tile's <|tile_x_separator|>
            row["input_ids"][im["offset"] + 1 + 144] = patch_id
        elif fault == "stray patch":  # the row's first token (<|begin_of_text|>)
            row["input_ids"][0] = patch_id
        elif fault == "grid":
            im["grid_h"] = 17
        elif fault == "marker grid":
            im["grid_h"], im["grid_w"], im["num_tokens"] = 0, 0, 1
        else:  # the row's first token is <|begin_of_text|>
            fc.break_image(row, im, fault, image_id)

    fc.rewrite_first(out, fc.oblong_image, change)
    report = verify_build(out)
    assert not report.ok
    assert FAULTS[fault] in {check for _, check in report.counts}, report.lines()


# ---------------------------------------------------------------------------------------------- the real model

TINY = Llama4Profile(name="llama4-tiny", tile_px=56, max_patches=6)
"""56 px tiles: 4x4 patches of 14 px, pixel-shuffled by 0.5 -> 4 tokens a tile; the same rule as 336 -> 144."""


@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory, coco_images):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models.registry, "_PROFILES", dict(packer.models.registry._PROFILES))
        register_profile(TINY)
        root = tmp_path_factory.mktemp("llama4-tiny")
        _write_images(root, coco_images)
        records = _records() + [
            {"messages": [{"role": "user", "content": [{"type": "image", "image": str(p)} for p in coco_images[1:3]]
                           + [{"type": "text", "text": "Two photos: what do they share?"}]}],
             "branches": [[{"role": "assistant", "content": "Both are photographs of everyday scenes."}],
                          [{"role": "assistant", "content": "Colours"},
                           {"role": "user", "content": "Say more, in a longer sentence this time."},
                           {"role": "assistant", "content": "They share warm colours and a cluttered background."}]]},
        ]
        data = root / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile=TINY.name, max_length=2048)
        build(config, progress=False)
        yield list(PackedDataset(root / "out", shuffle=False))


@pytest.mark.slow
def test_packed_equals_unpacked_with_tiles_trees_and_chunks(tiny_rows) -> None:
    """``Llama4ForConditionalGeneration`` (a chunk of 16, shorter than every row; NoPE temperature at floor_scale
    8), rows of several examples with images of 1 to 7 tiles, two images in a tree's prefix, branches across chunk
    boundaries: per-token losses, total and every gradient (vision tower included) equal each path alone, on sdpa and
    sdpa_varlen (flex: losses)."""
    batches, ids, vocab = ce.compact_vocab([collate([row]) for row in tiny_rows],
                                           ce.profile_token_ids(TINY, load_tokenizer("llama4")))
    torch.manual_seed(0)
    model = TINY.proof().tiny_model(token_ids=ids, vocab_size=vocab)
    tiles = set()
    for batch in batches:
        assert batch["input_ids"].shape[1] > 16 * 4  # every row spans several chunks
        tiles |= {n for _, n in TINY.proof().image_table(batch, ids)}
        report = ce.compare(model, batch, ["sdpa", "sdpa_varlen", "flex"], profile=TINY, token_ids=ids)
        for backend in ("sdpa", "sdpa_varlen", "flex"):
            assert report[backend]["ok"], report
    assert 1 in tiles and max(tiles) >= 5  # single-tile images and tiled ones with their global tile


@pytest.mark.slow
def test_check_equivalence_cli(tmp_path, coco_images) -> None:
    """``scripts/check_equivalence.py --model llama4`` on a user's JSONL: Scout's 336 px tiles, a 2 x 2 COCO canvas."""
    _write_images(tmp_path, coco_images)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()[:3]))
    assert ce.main(["--data", str(data), "--model", "llama4", "--backend", "sdpa_varlen", "--max-length", "4096",
                    "--max-batches", "1"]) == 0
