"""Mistral 3 against transformers 5.23.0's own code: token grids from headers against ``PixtralProcessor`` (its
``_get_num_multimodal_tokens``, and its real resize of the pixels and ``replace_image_token``), every example's ids
against the processor's ``input_ids`` for that path's conversation, the reader's pixels against the image
processor's, verify's row checks, the Pixtral tower keeping a batch's images apart; and the builtin tokenizer
against Mistral's own (mistral-common's ``Tekkenizer``) and the ids transformers' Mistral-Small-3.1 processor tests
list. Packed == unpacked on the real model: tests/models/test_conformance.py.

``PixtralProcessor`` is built from its module with ``PixtralImageProcessorPil`` (torchvision is not a dependency):
the module imports ``get_resize_output_image_size`` from the torchvision image processor's module, which cannot be
imported here, so ``_processor`` puts the PIL module's function (the same source, checked) in its place.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import shutil
import sys
import types
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.pixtral import image_processing_pil_pixtral

from packer.core.types import ImageRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError, RecordError
from packer.media.images import load_image
from packer.models import get_profile
from packer.models.mistral3 import image_tokens, token_grid
from packer.models.mistral3.tokenizers import MISTRAL3_CHAT_TEMPLATE, SPECIAL_TOKENS, tekken_file
from packer.report.verify import verify_build
from packer.train.collate import collate
from tests.models import family_checks as fc
from tests.models import released

# odd sizes: 1 px, a token and just off it, extreme aspect ratios, exactly the longest edge and just past it,
# sizes where the floor of the resize and mistral-common's round differ (1771x999, 1960x999)
ODD_SIZES = [(1, 1), (2, 3), (3, 2), (27, 28), (28, 28), (29, 28), (28, 57), (1, 700), (700, 1), (640, 480),
             (1540, 1540), (1541, 1540), (1540, 1541), (1541, 2), (5000, 10), (10, 5000), (4097, 3), (1771, 999),
             (1960, 999), (2114, 2000), (99, 100), (1000, 999)]
REFUSED = [(5000, 1), (1, 5000), (6000, 3), (1541, 1)]  # a side scales to 0 px: the processor raises
SETTINGS = {  # profile options -> PixtralProcessor / PixtralImageProcessorPil settings
    "mistral-small-3.1": {},  # longest edge 1540, patch 14, merge 2: 28 px a token
    "pixtral-12b-geometry": {"longest_edge": 1024, "patch_size": 16, "spatial_merge_size": 1},
    "small": {"longest_edge": 100, "patch_size": 7, "spatial_merge_size": 2},  # every COCO image is resized
}
REFUSED_AT = {"mistral-small-3.1": [], "pixtral-12b-geometry": [(4097, 3)],  # odd sizes refused per setting
              "small": [(1, 700), (700, 1), (1541, 2), (5000, 10), (10, 5000), (4097, 3)]}
DEFAULTS = {"longest_edge": 1540, "patch_size": 14, "spatial_merge_size": 2}


def _processor(tokenizer, options: dict | None = None):
    """transformers' PixtralProcessor with PixtralImageProcessorPil, set as the checkpoint's processor_config
    (patch_size, spatial_merge_size) and preprocessor_config (size) set it."""
    name = "transformers.models.pixtral.image_processing_pixtral"
    stubbed = importlib.util.find_spec("torchvision") is None and name not in sys.modules
    if stubbed:  # only while processing_pixtral is imported: nothing else sees the stand-in afterwards
        stub = types.ModuleType(name)  # the one name processing_pixtral imports from there
        stub.get_resize_output_image_size = image_processing_pil_pixtral.get_resize_output_image_size
        sys.modules[name] = stub
    try:
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    finally:
        if stubbed:
            del sys.modules[name]

    o = {**DEFAULTS, **(options or {})}
    return PixtralProcessor(image_processor=released.image_processor("mistral3", size={"longest_edge": o["longest_edge"]}),
                            tokenizer=tokenizer, patch_size=o["patch_size"], spatial_merge_size=o["spatial_merge_size"])


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("mistral3")


# ---------------------------------------------------------------------------------------------- tokenizer


def test_stub_is_the_torchvision_modules_function() -> None:
    """The function ``_processor`` stands in for is, character for character, the torchvision module's."""
    source = (Path(image_processing_pil_pixtral.__file__).parent / "image_processing_pixtral.py").read_text()
    own = re.search(r"^def get_resize_output_image_size\(.*?^    return .*?$", source, re.S | re.M).group(0)
    assert own == inspect.getsource(image_processing_pil_pixtral.get_resize_output_image_size).rstrip("\n")


def test_tokenizer_is_mistrals(tokenizer) -> None:
    """131,072 ids, mistral-common's special tokens at their ranks, and the ids transformers' Mistral-Small-3.1
    processor tests (hf-internal-testing/Mistral-Small-3.1-24B-Instruct-2503-only-processor) list for its text."""
    assert len(tokenizer) == 131072
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(20))
    assert tokenizer.convert_tokens_to_ids(["[IMG]", "[IMG_BREAK]", "[IMG_END]", "<SPECIAL_20>", "<SPECIAL_999>"]) == [
        10, 12, 13, 20, 999]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    text = "USER: [IMG][IMG][IMG_BREAK][IMG][IMG][IMG_END]\nWhat's the content of the image? ASSISTANT:"
    want = [21510, 1058, 1032, 10, 10, 12, 10, 10, 13, 1010, 7493, 1681, 1278, 4701, 1307, 1278, 3937, 1063, 1349,
            4290, 16002, 41150, 1058]  # test_processing_mistral3.py's ids, less the <s> its tokenizer adds
    assert tokenizer(text).input_ids == want  # the template writes <s>: the tokenizer adds none


@pytest.mark.slow
def test_tokenizer_equals_mistral_common() -> None:
    """The converted tokenizer encodes text as mistral-common's own Tekkenizer (tiktoken over the same file), and
    the special tokens written into the file are that Tekkenizer's defaults."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    assert tuple(str(getattr(t["token_str"], "value", t["token_str"])) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS) == SPECIAL_TOKENS
    ref = Tekkenizer.from_file(str(tekken_file()))
    tok = load_tokenizer("mistral3")
    texts = ["Hello world!", "  leading spaces\tand\ttabs\n\n\nnewlines  ", "Le café coûte 3,50 € à Paris.",
             "東京タワーは333メートルです。", "Ввод данных: 1234567890", "def f(x):\n    return x ** 2  # 🙂",
             "مرحبا بالعالم", "ÅÄÖ åäö ß ẞ", "a" * 300, "{\"key\": [1, 2, 3], \"ok\": true}", "URL: https://x.org/a?b=c"]
    for s in texts:
        assert tok(s).input_ids == ref.encode(s, bos=False, eos=False), s


def test_chat_template() -> None:
    """Mistral-Small-3.1's layout: <s>, a system turn in [SYSTEM_PROMPT], users in [INST] with [IMG] per image,
    assistants ended by </s>; no default system prompt; a string system content renders as its text."""
    tok = load_tokenizer("mistral3")
    assert tok.chat_template == MISTRAL3_CHAT_TEMPLATE
    conv = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}, {"type": "image"}]},
            {"role": "assistant", "content": "Two cats."}, {"role": "user", "content": "Sure?"}]
    assert tok.apply_chat_template(conv, tokenize=False) == (
        "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST][IMG]What?[IMG][/INST]Two cats.</s>[INST]Sure?[/INST]")
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, *conv[1:]]
    assert tok.apply_chat_template(parts, tokenize=False) == tok.apply_chat_template(conv, tokenize=False)
    assert tok.apply_chat_template(conv[1:3], tokenize=False) == "<s>[INST][IMG]What?[IMG][/INST]Two cats.</s>"


# ---------------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_counts_from_headers_equal_the_processor_rule(setting: str, coco_images, tokenizer) -> None:
    """(rows, cols) from the header: PixtralProcessor's ``_get_num_multimodal_tokens`` (the run's length) is
    rows * (cols + 1) on every COCO-mini image and the odd sizes; the run is replace_image_token's for the
    resized size; num_tokens == its [IMG]; verify's grid_num_tokens and stats' patches from the stored grid.

    That helper infers the channel axis of np.zeros((h, w, 3)) and takes it for channels-first when h is 1 or 3
    (700x1: 50 tokens, the pixels give 26); those heights are checked on the pixels only (the slow test)."""
    options = SETTINGS[setting]
    profile = get_profile("mistral3", **options)
    processor = _processor(tokenizer, options)
    sizes = [profile.image.plan(ImageRef(path=str(p))) for p in coco_images] + ODD_SIZES
    assert len(coco_images) > 200
    grids, refused = [], []
    for w, h in sizes:
        try:
            rows, cols = profile.image.token_grid(w, h)
        except RecordError:  # a side scaled to 0 px: no run the processor could write (its pixels raise)
            unit = profile.image.unit
            size = image_processing_pil_pixtral.get_resize_output_image_size(
                np.zeros((h, w, 3)), size=(profile.longest_edge,) * 2, patch_size=(unit, unit),
                input_data_format="channels_last")
            assert min(size) == 0, (w, h)
            refused.append((w, h))
            continue
        if h not in (1, 3):  # the helper measures np.zeros((h, w, 3)), read channels-first when h is 1 or 3
            assert processor._get_num_multimodal_tokens(image_sizes=[(h, w)])["num_image_tokens"] == [rows * (cols + 1)]
        run = profile.image.run((w, h))
        unit = profile.image.unit
        assert "".join(run.tokens) == processor.replace_image_token({"image_sizes": [(rows * unit, cols * unit)]}, 0)
        assert run.num_tokens == profile.image.num_tokens(w, h) == run.tokens.count("[IMG]") == rows * cols
        assert run.grid == profile.image.grid_thw(w, h) == (1, rows, cols) and run.lead == 0
        assert max(rows, cols) <= profile.image.max_side
        grids.append(run.grid)
    assert refused == REFUSED_AT[setting]
    grids = np.array(grids)
    assert profile.image.grid_num_tokens(grids).tolist() == [r * c for _, r, c in grids]
    assert profile.image.units(grids)[1].tolist() == [r * c * profile.spatial_merge_size**2 for _, r, c in grids]


def test_counts_refused_where_the_processor_cannot() -> None:
    """A side that scales to 0 px: RecordError (bad_image), as the processor raises; so do 0-px images."""
    profile = get_profile("mistral3")
    for w, h in [*REFUSED, (0, 5)]:
        with pytest.raises(RecordError) as e:
            profile.image.token_grid(w, h)
        assert e.value.reason == "bad_image"
    assert token_grid(640, 480, longest_edge=1540, unit=28) == (18, 23) == profile.image.token_grid(640, 480)
    assert image_tokens(2, 3) == ("[IMG]",) * 3 + ("[IMG_BREAK]",) + ("[IMG]",) * 3 + ("[IMG_END]",)


def test_grid_num_tokens_refuses_grids_no_image_gives() -> None:
    profile = get_profile("mistral3")  # at most 55 tokens a side
    grids = np.array([(1, 18, 23), (1, 1, 1), (1, 55, 55), (1, 56, 1), (1, 0, 3), (2, 3, 4), (1, 3, 0)])
    assert profile.image.grid_num_tokens(grids).tolist() == [414, 1, 3025, -1, -1, -1, -1]


def test_bad_settings_are_refused() -> None:
    for bad in ({"patch_size": 0}, {"longest_edge": 0}, {"spatial_merge_size": 0}):
        with pytest.raises(ConfigError, match=">= 1"):
            get_profile("mistral3", **bad)


def test_mistral_common_rounds_where_transformers_floors() -> None:
    """Mistral's own inference code (mistral-common's ImageEncoder) rounds the scaled-down sides, transformers
    floors them: 1771x999 is 31 rows here (the processor's), 32 there. packer follows transformers."""
    from mistral_common.tokens.tokenizers.image import ImageConfig, ImageEncoder

    encoder = ImageEncoder.__new__(ImageEncoder)
    encoder.image_config = ImageConfig(image_patch_size=14, max_image_size=1540, spatial_merge_size=2)
    assert encoder._image_to_num_tokens(Image.new("RGB", (1771, 999))) == (55, 32)
    assert get_profile("mistral3").image.token_grid(1771, 999) == (31, 55)
    assert encoder._image_to_num_tokens(Image.new("RGB", (640, 480)))[::-1] == get_profile("mistral3").image.token_grid(640, 480)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["mistral-small-3.1", "small"])
def test_counts_equal_the_processors_pixels(setting: str, coco_images, tokenizer) -> None:
    """PixtralProcessor on the pixels: ``image_sizes`` == the token grid * 28 px and ``input_ids`` of a lone
    [IMG] == the run's ids, on one COCO image per distinct grid and every odd size; the refused sizes raise."""
    options = SETTINGS[setting]
    profile = get_profile("mistral3", **options)
    processor = _processor(tokenizer, options)
    coco = {profile.image.grid_thw(*profile.image.plan(ImageRef(path=str(p)))): ImageRef(path=str(p)) for p in coco_images}
    refs = list(coco.values()) + [ImageRef(data=fc.png(w, h, seed=i)) for i, (w, h) in enumerate(ODD_SIZES)]
    for ref in refs:
        image = load_image(ref)
        w, h = image.size
        assert profile.image.plan(ref) == (w, h)
        if (w, h) in REFUSED_AT[setting]:
            with pytest.raises(ValueError):  # resized to a side of 0 px
                processor(text="[IMG]", images=[image])
            continue
        out = processor(text="[IMG]", images=[image], return_tensors="np")
        rows, cols = profile.image.token_grid(w, h)
        assert out["image_sizes"].tolist() == [[rows * profile.image.unit, cols * profile.image.unit]], (w, h)
        assert out["input_ids"][0].tolist() == tokenizer.convert_tokens_to_ids(list(profile.image.run((w, h)).tokens))
    if setting == "mistral-small-3.1":
        for w, h in REFUSED:
            with pytest.raises(ValueError):
                processor(text="[IMG]", images=[Image.new("RGB", (w, h))])


# ---------------------------------------------------------------------------------------------- a build


def _image_names(record: dict, path: list[dict]) -> list[str]:
    if "conversations" in record:
        return [record["image"]]
    return [c["image"] for m in path if isinstance(m["content"], list) for c in m["content"]
            if c.get("type") == "image" and "image" in c]


def _processor_ids(path: list[dict], images: list[Image.Image], processor) -> list[int]:
    """PixtralProcessor's input_ids for one path: its messages rendered by the chat template, then the
    processor on that text with the path's images."""
    msgs = [{"role": m["role"], "content": [{"type": "image"} if c.get("type") == "image" else c for c in m["content"]]
             if isinstance(m["content"], list) else m["content"]} for m in path]
    text = processor.tokenizer.apply_chat_template(msgs, tokenize=False)
    out = processor(text=text, images=images or None, return_tensors="np")
    return out["input_ids"][0].tolist()


@pytest.fixture(scope="module")
def built(tmp_path_factory, coco_images):
    """A build over a COCO image, odd sizes (one resized), two images in one turn, a tree with its image in the
    prefix and a nested branch, a system prompt and an image in a later turn, a LLaVA record, text, and an image
    the processor cannot take (rejected), in rows of several examples."""
    root = tmp_path_factory.mktemp("mistral3")
    fc.write_images(root, coco_images[0], {"wide.png": (1771, 40), "line.png": (1, 70), "tile.png": (28, 28),
                                        "small.png": (40, 30), "sliver.png": (3000, 1)})
    records = [*fc.image_records(), {"messages": [
        {"role": "user", "content": [{"type": "image", "image": "sliver.png"}, {"type": "text", "text": "And this?"}]},
        {"role": "assistant", "content": "Nothing."}]}]
    return fc.build_records(root, records, profile="mistral3", max_length=512)


@pytest.mark.slow
def test_expansion_equals_the_processor(built, tokenizer) -> None:
    """Every root-to-leaf path of every example == PixtralProcessor's input_ids for that path's conversation; the
    build verifies against its input; the image no processor can take is rejected with its reason."""
    out = built["root"] / "out"
    assert built["result"].manifest["totals"]["rejected"] == 1
    reject = json.loads((out / "rejects.jsonl").read_text().splitlines()[0])
    assert reject["reason"] == "bad_image" and reject["line"] == 7, reject
    assert verify_build(out, inputs=[str(built["data"])]).ok
    processor = _processor(tokenizer)
    rows, root = built["rows"], built["root"]
    assert len(rows) > 1 and any(len(r["example_ids"]) > 1 for r in rows)
    seen = 0
    for row, example_id, record, positions, path in fc.each_path(rows, built["records"], fc.chat_paths):
        images = [load_image(ImageRef(path=str(root / n))) for n in _image_names(record, path)]
        assert row["input_ids"][positions].tolist() == _processor_ids(path, images, processor), example_id
        seen += 1
    assert seen == 1 + 1 + 3 + 1 + 1 + 1


@pytest.mark.slow
def test_reader_equals_the_image_processor(built, tokenizer) -> None:
    """collate of several rows: pixel_values and image_sizes == PixtralProcessor's for the rows' images (token
    order), each image's size its stored grid's; the proof cuts the batch per image at the offsets."""
    rows, root = built["rows"], built["root"]
    batch = collate(rows)
    images = [im for r in rows for im in r["images"]]
    decoded = [load_image(ImageRef(path=str(root / Path(im["source"]).name))) for im in images]
    want = _processor(tokenizer)(text="[IMG]" * len(decoded), images=decoded, return_tensors="pt")
    for key in ("pixel_values", "image_sizes"):
        assert batch[key].dtype == want[key].dtype and torch.equal(batch[key], want[key]), key
    assert batch["image_sizes"].tolist() == [[im["grid_h"] * 28, im["grid_w"] * 28] for im in images]
    profile = get_profile("mistral3")
    token_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in profile.proof().model_tokens()}
    table = profile.proof().image_table(batch, token_ids)
    assert [off for off, _ in table] == batch["image_offsets"].tolist()
    assert (batch["input_ids"][0, batch["image_offsets"]] == 10).all()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["image token", "break", "stray image token", "rows and cols swapped", "grid",
                                   "offset"])
def test_verify_checks_every_row(built, tmp_path, tokenizer, fault) -> None:
    """An [IMG] of a row replaced, an [IMG_BREAK] made an [IMG], a stray [IMG], a grid that is not the run's
    layout (rows and cols swapped: the same count), a grid no image gives, or an entry off its run: verify
    says so."""
    out = tmp_path / "out"
    shutil.copytree(built["root"] / "out", out)
    text_id = tokenizer("x").input_ids[0]
    image_id = tokenizer.convert_tokens_to_ids("[IMG]")

    def change(row: dict, im: dict) -> None:
        if fault == "image token":
            row["input_ids"][im["offset"] + 1] = text_id
        elif fault == "break":
            row["input_ids"][im["offset"] + im["grid_w"]] = image_id
        else:  # the row's first token is <s>
            fc.break_image(row, im, fault, image_id)

    fc.rewrite_first(out, partial(fc.oblong_image, min_side=2), change)
    report = verify_build(out)
    assert not report.ok
    # swapped, the rows' spans run past the run onto the text after it, which carries labels
    want = {"grid": {"image grid"}, "rows and cols swapped": {"image tokens", "image labels"}}.get(fault, {"image tokens"})
    assert {check for _, check in report.counts} == want, report.lines()


# ---------------------------------------------------------------------------------------------- the vision tower


def _rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Max |got - want| per image over max |want| of that image."""
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want, strict=True))


def _features(model, pixels: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(model.model.get_image_features(pixel_values=pixels, image_sizes=sizes).pooler_output)


def test_pixtral_tower_keeps_images_apart(monkeypatch) -> None:
    """Several images in one call (as a packed batch gives them) == each image alone: the tower's block mask
    keeps them apart and its 2-D rope positions restart per image, on SDPA and under packer's backends (the
    tower's calls are not causal: they fall through to SDPA with its mask)."""
    from packer.train.hf import use_packed_attention

    profile = get_profile("mistral3")
    torch.manual_seed(0)
    model = profile.proof().tiny_model(token_ids={"[IMG]": 5, "[IMG_BREAK]": 6, "[IMG_END]": 7}, vocab_size=64)
    pixels, sizes = torch.randn(3, 3, 84, 112), torch.tensor([[84, 112], [56, 28], [28, 112]])
    alone = [f for i in range(3) for f in _features(model, pixels[i : i + 1, :, : sizes[i, 0], : sizes[i, 1]],
                                                     sizes[i : i + 1])]
    assert [f.shape[0] for f in alone] == [12, 2, 4]
    for backend in (None, "sdpa_varlen", "sdpa"):
        if backend is not None:
            use_packed_attention(model, backend)
        assert _rel(_features(model, pixels, sizes), alone) < 1e-6, backend
    # the check can fail: with one block over every patch (no mask), an image's features move
    module = sys.modules[type(model.model.vision_tower).__module__]
    model.set_attn_implementation("sdpa")
    monkeypatch.setattr(module, "generate_block_attention_mask", lambda lengths, x: None)
    assert _rel(_features(model, pixels, sizes), alone) > 1e-3


def test_pixtral_tower_under_a_flash_named_backend() -> None:
    """transformers' Pixtral tower asks ``is_flash_attention_requested`` (any name holding "flash"): then it passes
    the images' ``cu_seq_lens_q/k`` instead of its block mask. Set on the tower's config directly (on CPU
    transformers refuses to switch a model to "packer_flash": it looks for a hub kernel of that name): packer's
    function keeps each image within itself (packer/train/hf.py), as each image alone."""
    from packer.train.hf import register

    profile = get_profile("mistral3")
    torch.manual_seed(0)
    model = profile.proof().tiny_model(token_ids={"[IMG]": 5, "[IMG_BREAK]": 6, "[IMG_END]": 7}, vocab_size=64)
    pixels, sizes = torch.randn(2, 3, 56, 84), torch.tensor([[56, 84], [28, 56]])
    alone = [f for i in range(2) for f in _features(model, pixels[i : i + 1], sizes[i : i + 1])]
    register()
    model.model.vision_tower.config._attn_implementation_internal = "packer_flash"
    assert _rel(_features(model, pixels, sizes), alone) < 1e-6
