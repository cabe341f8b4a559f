"""The Encoder against the real Qwen2-VL tokenizer and template: records of every kind, images, trees,
rejects, truncation and pickling, with hand-derived expectations (built piece by piece, see
tests/encode/test_labels.py); then its fast paths against the general path on many random records.

- ``Encoder.encode_batch`` (one tokenizer call per batch, the registered ChatML renderer, byte-length token
  boundaries) gives byte-identical Encoded examples, and the same located errors, as ``encode`` one example
  at a time through the Jinja template with character offsets (the general path).
- A pickled Encoder encodes identically in a fresh process without importing transformers.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.core.types import IGNORE_INDEX, Example, ImageRef, Message, Node
from packer.encode import OVERLONG_POLICIES
from packer.encode.encoder import FAST_PATHS, Encoder
from packer.encode.render import stage
from packer.errors import ConfigError, RecordError
from packer.models import get_profile
from tests.encode.helpers import (
    IMAGE_PAD,
    IMAGES,
    SYS_DEFAULT,
    VISION_END,
    VISION_START,
    Seq,
    assert_encoded,
    assert_same,
    builtin,
    example,
    general,
    msg,
    nonempty,
    one_by_one,
    parse_all,
    text,
)

# ---------------------------------------------------------------- records, images


@pytest.mark.slow
def test_llava_record(tok, qwen, img):
    rec = {
        "image": str(img),
        "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A room."}],
    }
    enc = qwen.encode(example(rec))
    n = 345  # 640x427 -> smart_resize 644x420 -> grid (1, 30, 46) -> 30*46/4
    seq = (
        Seq(tok)
        .add(SYS_DEFAULT)
        .add("<|im_start|>user\n")
        .image(n)
        .add("\nWhat?")
        .add("<|im_end|>")
        .add("\n")
    )
    seq.turn("assistant", "A room.", True)
    assert_encoded(enc, seq)
    [im] = enc.images
    assert (im.source, im.data, im.grid_thw, im.offset, im.num_tokens) == (
        str(img),
        None,
        (1, 30, 46),
        15,
        345,
    )


def test_text_record(tok, qwen):
    text = "The quick brown fox.\nJumps over 1234 lazy dogs."
    enc = qwen.encode(example({"text": text}))
    ids = tok.encode(text, add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]  # eos, no bos
    assert enc.input_ids.tolist() == ids
    assert enc.labels.tolist() == [IGNORE_INDEX] + ids[1:]
    np.testing.assert_array_equal(enc.position_ids, np.arange(len(ids)))


def test_image_message_labels_and_mrope(tok, qwen, img):
    rec = {
        "messages": [
            msg("user", [{"type": "text", "text": "Look:"}, {"type": "image", "image": str(img)}]),
            msg("assistant", "Nice."),
        ]
    }
    enc = qwen.encode(example(rec))
    seq = Seq(tok).add(SYS_DEFAULT).add("<|im_start|>user\nLook:").image(345).add("<|im_end|>").add("\n")
    seq.turn("assistant", "Nice.", True)
    assert_encoded(enc, seq)
    off = len(tok.encode(SYS_DEFAULT + "<|im_start|>user\nLook:<|vision_start|>"))
    assert enc.images[0].offset == off and enc.num_vision_tokens == 345
    # mRoPE: the image's t row is constant, h and w walk the 15x23 merged grid, text resumes at max + 1
    m = enc.mrope_position_ids
    assert m.shape == (3, enc.num_tokens)
    block = m[:, off : off + 345]
    assert (block[0] == off).all()
    np.testing.assert_array_equal(block[1], off + np.repeat(np.arange(15), 23))
    np.testing.assert_array_equal(block[2], off + np.tile(np.arange(23), 15))
    assert m[0, off + 345] == off + 23  # <|vision_end|>: current_pos + max(30, 46) // 2


def test_image_counts_on_real_coco(tok, coco_images):
    """Expansion = profile.num_tokens of each real image, for the dynamic (qwen) and fixed (llava) profiles."""
    files = coco_images[::20]  # 12 images of different sizes
    rec = {
        "messages": [
            msg(
                "user",
                [{"type": "image", "image": str(p)} for p in files] + [{"type": "text", "text": "All?"}],
            ),
            msg("assistant", "Yes."),
        ]
    }
    for name in ("qwen2-vl", "llava"):
        profile = get_profile(name)
        enc = Encoder(tok, profile).encode(example(rec))
        sizes = [Image.open(p).size for p in files]
        want = [profile.image.num_tokens(w, h) for w, h in sizes]
        assert [im.num_tokens for im in enc.images] == want
        assert [im.grid_thw for im in enc.images] == [profile.image.grid_thw(w, h) for w, h in sizes]
        pads = np.flatnonzero(enc.input_ids == IMAGE_PAD)
        assert pads.shape[0] == sum(want) and (enc.labels[pads] == IGNORE_INDEX).all()
        for (
            im
        ) in enc.images:  # each image is one contiguous run starting at its offset, framed by vision tokens
            assert (enc.input_ids[im.offset : im.offset + im.num_tokens] == IMAGE_PAD).all()
            assert (
                enc.input_ids[im.offset - 1] == VISION_START
                and enc.input_ids[im.offset + im.num_tokens] == VISION_END
            )
    assert want == [576] * len(files)


def test_inline_image(tok, qwen, img):
    import base64

    url = "data:image/jpeg;base64," + base64.b64encode(img.read_bytes()).decode()
    enc = qwen.encode(
        example({"messages": [msg("user", [{"type": "image", "image": url}]), msg("assistant", "x")]})
    )
    [im] = enc.images
    assert (im.source, im.data, im.num_tokens) == ("", img.read_bytes(), 345)


# ---------------------------------------------------------------- trees


def tree_record() -> dict:
    """Root [user Q] with three branches; the second has two children of its own."""
    return {
        "messages": [msg("system", "Be kind."), msg("user", "Q")],
        "branches": [
            [msg("assistant", "A1")],
            {
                "messages": [msg("assistant", "A2")],
                "branches": [
                    [msg("user", "Why?"), msg("assistant", "Because.")],
                    [msg("user", "Sure?", loss=True)],
                ],
            },
            [msg("assistant", "A3", loss=False), msg("user", "Hm."), msg("assistant", "A3b")],
        ],
    }


def test_tree_three_branches_nested(tok, qwen):
    enc = qwen.encode(example(tree_record()))
    root = Seq(tok).turn("system", "Be kind.", False).turn("user", "Q", False)
    n1 = Seq(tok).turn("assistant", "A1", True)
    n2 = Seq(tok).turn("assistant", "A2", True)
    n3 = Seq(tok).turn("user", "Why?", False).turn("assistant", "Because.", True)
    n4 = Seq(tok).turn("user", "Sure?", True)
    n5 = Seq(tok).turn("assistant", "A3", False).turn("user", "Hm.", False).turn("assistant", "A3b", True)
    nodes = [root, n1, n2, n3, n4, n5]
    whole = Seq(tok)
    for s in nodes:
        whole.ids += s.ids
        whole.labels += s.labels
    assert_encoded(enc, whole)
    sizes = [len(s.ids) for s in nodes]
    assert enc.node_offsets.tolist() == np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    assert enc.node_parents.tolist() == [-1, 0, 0, 2, 2, 0]
    # positions: every branch continues from its parent's end
    r, a2 = sizes[0], sizes[2]
    expected_pos = np.concatenate(
        [
            np.arange(r),
            r + np.arange(sizes[1]),
            r + np.arange(a2),
            r + a2 + np.arange(sizes[3]),
            r + a2 + np.arange(sizes[4]),
            r + np.arange(sizes[5]),
        ]
    )
    np.testing.assert_array_equal(enc.position_ids, expected_pos)
    np.testing.assert_array_equal(enc.mrope_position_ids, np.tile(expected_pos, (3, 1)))
    # each root-to-leaf path is exactly the linear rendering of that conversation
    path = [
        msg("system", "Be kind."),
        msg("user", "Q"),
        msg("assistant", "A2"),
        msg("user", "Why?"),
        msg("assistant", "Because."),
    ]
    rows = np.concatenate([np.arange(0, r), np.arange(enc.node_offsets[2], enc.node_offsets[4])])
    np.testing.assert_array_equal(
        enc.input_ids[rows], tok.apply_chat_template(path, tokenize=True, return_dict=False)
    )


def test_tree_auto_system_prompt_belongs_to_root(tok, qwen, img):
    rec = {
        "messages": [
            msg("user", [{"type": "image", "image": str(img)}, {"type": "text", "text": "Describe."}])
        ],
        "branches": [[msg("assistant", "A plane.")], [msg("assistant", "Mountains.")]],
    }
    enc = qwen.encode(example(rec))
    root = (
        Seq(tok)
        .add(SYS_DEFAULT)
        .add("<|im_start|>user\n")
        .image(345)
        .add("Describe.")
        .add("<|im_end|>")
        .add("\n")
    )
    whole = Seq(tok)
    for s in (
        root,
        Seq(tok).turn("assistant", "A plane.", True),
        Seq(tok).turn("assistant", "Mountains.", True),
    ):
        whole.ids += s.ids
        whole.labels += s.labels
    assert_encoded(enc, whole)
    assert enc.node_offsets.tolist() == [0, len(root.ids), len(root.ids) + 8]
    # both branches continue the mRoPE positions from the same point after the image
    m = enc.mrope_position_ids
    assert m[0, enc.node_offsets[1]] == m[0, enc.node_offsets[2]] == m[0, len(root.ids) - 1] + 1


# ---------------------------------------------------------------- rejects


def test_literal_image_token_in_text(qwen, img):
    rec = {
        "messages": [
            msg("user", [{"type": "image", "image": str(img)}, {"type": "text", "text": "<|image_pad|>"}]),
            msg("assistant", "a"),
        ]
    }
    with pytest.raises(
        RecordError,
        match=r"image_count_mismatch: 2 image tokens for 1 images: the text holds '<\|image_pad\|>' literally",
    ):
        qwen.encode(example(rec))


def test_text_profile_rejects_images(tok, img):
    r = Encoder(tok, get_profile("text"))
    with pytest.raises(RecordError, match=r"image_count_mismatch: profile 'text' takes no images"):
        r.encode(
            example(
                {"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]}
            )
        )


def test_bad_image_is_located(qwen, tmp_path: Path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(RecordError, match=r"^t.jsonl:3: bad_image: "):
        qwen.encode(
            example(
                {"messages": [msg("user", [{"type": "image", "image": str(bad)}]), msg("assistant", "y")]}
            )
        )


# ---------------------------------------------------------------- overlong / truncation


def test_overlong_policies_are_checked(tok):
    assert OVERLONG_POLICIES == ("drop", "truncate", "truncate_left", "keep_last_turns")
    with pytest.raises(ConfigError, match=r"'overlong' must be one of drop, truncate, truncate_left, "
                       r"keep_last_turns, got 'cut'"):
        Encoder(tok, get_profile("text"), overlong="cut")
    with pytest.raises(ConfigError, match=r"'max_length' must be a positive integer, got 0"):
        Encoder(tok, get_profile("text"), max_length=0)


def image_chat(img: Path) -> Example:
    """sys(11) + '<|im_start|>user\\nHi' + image(345+2) + ... : the image occupies tokens [15+2, 17+345)."""
    return example(
        {
            "messages": [
                msg("user", "Hi"),
                msg("assistant", "Hello there."),
                msg("user", [{"type": "image", "image": str(img)}, {"type": "text", "text": "And this?"}]),
                msg("assistant", "A plane."),
            ]
        }
    )


def test_overlong_drop(tok, img):
    full = Encoder(tok, get_profile("qwen2-vl")).encode(image_chat(img))
    L = full.num_tokens
    assert Encoder(tok, get_profile("qwen2-vl"), max_length=L).encode(image_chat(img)).num_tokens == L
    with pytest.raises(RecordError, match=rf"^t.jsonl:3: overlong: {L} tokens > --max-length {L - 1}$"):
        Encoder(tok, get_profile("qwen2-vl"), max_length=L - 1).encode(image_chat(img))


def test_truncate_cuts_before_image(tok, img):
    full = Encoder(tok, get_profile("qwen2-vl")).encode(image_chat(img))
    off = full.images[0].offset
    head = Seq(tok).add(SYS_DEFAULT).turn("user", "Hi", False).turn("assistant", "Hello there.", True)
    head.add("<|im_start|>user\n")
    assert off == len(head.ids) + 1  # the <|vision_start|> sits between
    for max_length in (off + 1, off + 200, off + 344):  # inside the image: cut before <|vision_start|>
        enc = Encoder(tok, get_profile("qwen2-vl"), max_length=max_length, overlong="truncate").encode(
            image_chat(img)
        )
        assert_encoded(enc, head)
        assert enc.images == [] and enc.node_offsets.tolist() == [0]
        np.testing.assert_array_equal(enc.mrope_position_ids, np.tile(np.arange(len(head.ids)), (3, 1)))
    # cutting right after the image keeps it whole
    enc = Encoder(tok, get_profile("qwen2-vl"), max_length=off + 345, overlong="truncate").encode(
        image_chat(img)
    )
    assert enc.num_tokens == off + 345 and len(enc.images) == 1
    np.testing.assert_array_equal(enc.labels, full.labels[: off + 345])
    np.testing.assert_array_equal(enc.mrope_position_ids, full.mrope_position_ids[:, : off + 345])
    # cutting inside the last answer keeps its first tokens with their loss
    enc = Encoder(tok, get_profile("qwen2-vl"), max_length=full.num_tokens - 3, overlong="truncate").encode(
        image_chat(img)
    )
    np.testing.assert_array_equal(enc.labels, full.labels[:-3])


def test_truncate_tree_drops_later_nodes(tok, qwen):
    full = qwen.encode(example(tree_record()))
    cut = int(full.node_offsets[3]) + 2  # two tokens into node 3 (the nested "Why?" branch)
    enc = Encoder(tok, get_profile("qwen2-vl"), max_length=cut, overlong="truncate").encode(
        example(tree_record())
    )
    assert enc.node_offsets.tolist() == full.node_offsets[:4].tolist()
    assert enc.node_parents.tolist() == [-1, 0, 0, 2]
    np.testing.assert_array_equal(enc.input_ids, full.input_ids[:cut])
    np.testing.assert_array_equal(enc.labels, full.labels[:cut])
    np.testing.assert_array_equal(enc.position_ids, full.position_ids[:cut])
    # a cut exactly at a node start drops that node
    at = int(full.node_offsets[3])
    enc = Encoder(tok, get_profile("qwen2-vl"), max_length=at, overlong="truncate").encode(
        example(tree_record())
    )
    assert enc.node_offsets.tolist() == full.node_offsets[:3].tolist() and enc.num_tokens == at


def test_untruncatable(tok, img):
    # the first loss token comes after the image: any cut inside the image leaves no loss
    rec = {
        "messages": [
            msg("user", [{"type": "image", "image": str(img)}, {"type": "text", "text": "?"}]),
            msg("assistant", "ok"),
        ]
    }
    r = Encoder(tok, get_profile("qwen2-vl"), max_length=100, overlong="truncate")
    with pytest.raises(
        RecordError, match=r"^t.jsonl:3: untruncatable: cutting to --max-length 100 \(at token 14, "
    ):
        r.encode(example(rec))
    with pytest.raises(RecordError, match=r"untruncatable"):
        Encoder(tok, get_profile("qwen2-vl"), max_length=3, overlong="truncate").encode(
            example({"messages": [msg("user", "A long question here."), msg("assistant", "ok")]})
        )


# ---------------------------------------------------------------- any Example, pickling, the COCO script


def test_hand_built_example_without_records(tok, qwen):
    """The Encoder works on any Example (not only parse_record's), e.g. a single-node tree built in code."""
    ex = Example(
        root=Node([Message("user", ["a"]), Message("assistant", ["b"])]), kind="messages", path="p", line=1
    )
    enc = qwen.encode(ex)
    assert enc.num_loss_tokens == 2 and enc.images == []
    assert ImageRef(path="x") != ImageRef(path="y")


@pytest.mark.slow
def test_encoder_pickles(qwen, img):
    """Worker processes receive the Encoder pickled; it must encode identically there."""
    import pickle

    ex = example({"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]})
    a, b = qwen.encode(ex), pickle.loads(pickle.dumps(qwen)).encode(ex)
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.mrope_position_ids, b.mrope_position_ids)


@pytest.mark.parametrize("name", ["internvl", "gemma4"])
def test_pickled_encoder_lays_out_runs_of_named_tokens(img, name):
    """A family whose runs name their tokens (``MediaRun.tokens``: InternVL's <img> ... </img>, Gemma 4's) looks
    them up in a worker too, where the pickled Encoder holds the Rust tokenizer only (at 7d01253 that lookup
    went through the transformers tokenizer, None there: every --num-proc > 1 build of these families failed)."""
    profile = get_profile(name)
    encoder = Encoder(builtin(profile.default_tokenizer), profile)
    ex = example({"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]})
    worker = pickle.loads(pickle.dumps(encoder))
    assert worker.tokenizer is None
    a, b = encoder.encode(ex), worker.encode(ex)
    assert len(a.images) == 1 and a.images[0].num_tokens > 1
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)


@pytest.mark.slow
def test_coco_script_end_to_end(tok, qwen, coco_dir: Path, tmp_path: Path, monkeypatch):
    """scripts/coco_to_jsonl.py output parses and encodes with no reject, from another working directory."""
    import json
    import runpy

    from packer.formats.read import read_jsonl

    out = tmp_path / "jsonl"
    monkeypatch.setattr("sys.argv", ["coco_to_jsonl.py", "--coco", str(coco_dir), "--out", str(out)])
    script = Path(__file__).resolve().parents[2] / "scripts" / "coco_to_jsonl.py"
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    first = (out / "coco_caption_trees.jsonl").read_bytes()
    monkeypatch.chdir(tmp_path)
    captions = json.loads((coco_dir / "annotations" / "captions_train2017.json").read_text())
    n_captioned = len({a["image_id"] for a in captions["annotations"]})
    encoded = {}
    for name in ("coco_caption_trees.jsonl", "coco_grounding.jsonl"):
        rows = list(read_jsonl(str(out / name)))
        assert all(not isinstance(ex, RecordError) for _, ex in rows)
        encoded[name] = [qwen.encode(ex) for _, ex in rows]
    trees = encoded["coco_caption_trees.jsonl"]
    assert len(trees) >= n_captioned and all(len(e.images) == 1 for e in trees)
    # image 790 (train2017, the first file): 5 captions -> root + 5 branches, all children of the root
    assert trees[0].node_parents.tolist() == [-1, 0, 0, 0, 0, 0]
    # its grounding answer for the dining table, from the raw annotation: bbox [x, y, w, h] in a 640x480 image
    instances = json.loads((coco_dir / "annotations" / "instances_train2017.json").read_text())
    table = [a for a in instances["annotations"] if a["image_id"] == 790 and a["category_id"] == 67]
    [im] = [i for i in instances["images"] if i["id"] == 790]
    x, y, w, h = table[0]["bbox"]
    W, H = im["width"], im["height"]
    box = f"<|box_start|>({int(x / W * 1000)},{int(y / H * 1000)}),({int((x + w) / W * 1000)},{min(999, int((y + h) / H * 1000))})<|box_end|>"
    answer = "<|object_ref_start|>dining table<|object_ref_end|>" + box + "<|im_end|>"
    g = encoded["coco_grounding.jsonl"][0]
    loss_ids = g.labels[g.labels != IGNORE_INDEX]
    want = tok.encode(answer, add_special_tokens=False)
    assert loss_ids[: len(want)].tolist() == want
    # deterministic: a second run writes the same bytes
    monkeypatch.setattr("sys.argv", ["coco_to_jsonl.py", "--coco", str(coco_dir), "--out", str(out)])
    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert (out / "coco_caption_trees.jsonl").read_bytes() == first


def test_coco_script_video_trees(coco_dir: Path, tmp_path: Path, monkeypatch):
    """``--videos 2``: two slideshow clips of three COCO photos each, one QA tree per clip (the make demo
    video build); each encodes with qwen2.5-vl to one video shared by three branches, answers as loss."""
    import json
    import runpy

    from packer.formats.read import read_jsonl

    out = tmp_path / "jsonl"
    monkeypatch.setattr("sys.argv", ["coco_to_jsonl.py", "--coco", str(coco_dir), "--out", str(out), "--videos", "2"])
    script = Path(__file__).resolve().parents[2] / "scripts" / "coco_to_jsonl.py"
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    records = [json.loads(line) for line in (out / "coco_video_trees.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["coco-slideshow-0", "coco-slideshow-1"]
    profile = get_profile("qwen2.5-vl")
    encoder = Encoder(builtin(profile.default_tokenizer), profile)
    monkeypatch.chdir(tmp_path)  # paths resolve against the JSONL's directory, not the working one
    for (_, ex), record in zip(read_jsonl(str(out / "coco_video_trees.jsonl")), records, strict=True):
        enc = encoder.encode(ex)
        (video,) = enc.videos
        assert video.grid_thw == (6, 24, 32) and video.num_tokens == 6 * 24 * 32 // 4  # 6 s at 2 fps, 448x336
        assert enc.node_parents.tolist() == [-1, 0, 0, 0]
        loss = enc.labels[enc.labels != IGNORE_INDEX].tolist()
        for branch in record["branches"]:
            answer = encoder.tokenizer.encode(branch[1]["content"], add_special_tokens=False)
            assert any(loss[i : i + len(answer)] == answer for i in range(len(loss)))


# ---------------------------------------------------------------- fast paths vs the general path


@st.composite
def content(draw, *, images: bool) -> str | list[dict]:
    if not images or not draw(st.booleans()):
        return draw(nonempty)
    parts: list[dict] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            parts.append({"type": "image", "image": f"img/{draw(st.sampled_from(IMAGES))}"})
        else:
            parts.append({"type": "text", "text": draw(nonempty)})
    return parts


@st.composite
def message(draw, role: str, *, images: bool = False) -> dict:
    m = {"role": role, "content": draw(content(images=images))}
    if draw(st.integers(0, 5)) == 0:
        m["loss"] = draw(st.booleans())
    return m


@st.composite
def turns(draw, *, images: bool) -> list[dict]:
    msgs = [draw(message("system"))] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 3))):
        msgs.append(draw(message(draw(st.sampled_from(["user", "user", "tool"])), images=images)))
        msgs.append(draw(message("assistant", images=images and draw(st.integers(0, 5)) == 0)))
    return msgs


@st.composite
def branch(draw, depth: int):
    msgs = draw(turns(images=False))[-2:] if draw(st.booleans()) else [draw(message("assistant"))]
    if depth == 0 or draw(st.booleans()):
        return msgs
    return {"messages": msgs, "branches": draw(st.lists(branch(depth - 1), min_size=1, max_size=3))}


@st.composite
def record(draw) -> dict:
    kind = draw(st.sampled_from(["chat", "chat", "tree", "tree", "llava", "text"]))
    images = draw(st.booleans())
    if kind == "chat":
        return {"messages": draw(turns(images=images))}
    if kind == "tree":
        return {"messages": draw(turns(images=images))[:-1], "branches": draw(st.lists(branch(2), min_size=1, max_size=3))}
    if kind == "llava":
        n = draw(st.integers(0, 2)) if images else 0
        conv = [{"from": "human", "value": "<image>\n" * n + draw(text)}, {"from": "gpt", "value": draw(nonempty)}]
        rec: dict = {"conversations": conv}
        if n:
            rec["image"] = [f"img/{draw(st.sampled_from(IMAGES))}" for _ in range(n)]
        return rec
    return {"text": draw(nonempty)}


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=16),
       name=st.sampled_from(["qwen2-vl", "qwen2-vl", "qwen2-vl-truncate", "qwen2-vl-drop", "llava", "text"]))
def test_encode_batch_equals_general_path(encoders, image_root, records, name):
    encoder = encoders[name]
    parsed = parse_all(records, image_root)
    examples = [p for p in parsed if isinstance(p, Example)]
    batch = encoder.encode_batch(examples)
    assert len(batch) == len(examples)
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)


def test_fast_false_runs_only_the_general_paths(tok, image_root):
    """``fast=False`` takes no fast path (the path counts say which ran), ``fast={name}`` takes that one only,
    and all of them give the same bytes."""
    records = [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "What?"}]},
                      {"role": "assistant", "content": "A cat."}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]},
        {"messages": [{"role": "user", "content": "Hi"}], "branches": [[{"role": "assistant", "content": "One."}],
                                                                      [{"role": "assistant", "content": "Two."}]]},
        {"text": "plain text"},
    ]
    examples = [ex for ex in parse_all(records, image_root) if isinstance(ex, Example)]
    profile = get_profile("qwen2-vl", max_pixels=64 * 28 * 28)
    fast, slow = Encoder(tok, profile), Encoder(tok, profile, fast=False)
    want = fast.encode_batch(examples)
    for got, w in zip(slow.encode_batch(examples), want, strict=True):
        assert_same(got, w)
    taken, general_taken = fast.path_counts(), slow.path_counts()
    fast_keys = {"render:python", "labels:byte-lengths", "tokens:fastokens", "finish:batch"}
    assert all(taken[k] > 0 for k in fast_keys), taken
    assert not any(general_taken[k] for k in fast_keys), general_taken
    assert all(general_taken[k] > 0 for k in ("render:jinja", "labels:offsets", "tokens:hf")), general_taken
    keys = {"python-template": "render:python", "byte-lengths": "labels:byte-lengths", "fastokens": "tokens:fastokens",
            "batch-finish": "finish:batch"}
    assert set(keys) == set(FAST_PATHS) - {"plain-columns"}  # (lines, not Examples: tests/encode/test_plain_columns.py)
    for name in keys:
        names = {name, "byte-lengths"} if name == "fastokens" else {name}  # an engine's boundaries: byte lengths
        one = Encoder(tok, profile, fast=names)
        for got, w in zip(one.encode_batch(examples), want, strict=True):
            assert_same(got, w)
        assert {k for k in fast_keys if one.path_counts()[k]} == {keys[n] for n in names}
    alone = Encoder(tok, profile, fast={"fastokens"})  # without byte lengths no boundaries: the HF tokenizer
    alone.encode_batch(examples)
    assert alone.path_counts()["tokens:fastokens"] == 0 and alone.path_counts()["tokens:hf"] > 0
    with pytest.raises(ConfigError, match="unknown fast paths"):
        Encoder(tok, profile, fast={"warp-drive"})


def test_encode_batch_mixed_errors_are_located(encoders, image_root):
    """Bad records in the middle of a batch: each gets its own located error, the others are unaffected."""
    records = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "only a question"}]},  # no_loss_tokens
        {"text": "literal <|image_pad|> token"},  # image_count_mismatch
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "?"}]},
                      {"role": "assistant", "content": "A picture."}]},
        {"messages": [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y"}]},  # overlong
    ]
    examples = [ex for ex in parse_all(records, image_root) if isinstance(ex, Example)]
    encoder = encoders["qwen2-vl-drop"]
    batch = encoder.encode_batch(examples)
    assert [b.reason if isinstance(b, RecordError) else "ok" for b in batch] == [
        "ok", "no_loss_tokens", "image_count_mismatch", "ok", "overlong"]
    assert [b.line for b in batch if isinstance(b, RecordError)] == [2, 3, 5]
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)
    assert encoder.encode_batch([]) == []


@pytest.mark.slow
def test_pickled_encoder_needs_no_transformers(encoders, image_root, tmp_path):
    """A worker gets the Encoder pickled: same Encoded bytes, and transformers is never imported."""
    recs = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/a.jpg"}, {"type": "text", "text": "What?"}]},
                          {"role": "assistant", "content": "A cat."}]},
            {"messages": [{"role": "user", "content": "Hi"}], "branches": [[{"role": "assistant", "content": "One."}],
                                                                          [{"role": "assistant", "content": "Two."}]]}]
    examples = [ex for ex in parse_all(recs, image_root) if isinstance(ex, Example)]
    (tmp_path / "r.pkl").write_bytes(pickle.dumps((encoders["qwen2-vl"], examples)))
    script = (
        "import pickle, sys\n"
        f"r, exs = pickle.loads(open({str(tmp_path / 'r.pkl')!r}, 'rb').read())\n"
        "out = r.encode_batch(exs)\n"
        "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'transformers was imported'\n"
        "sys.stdout.buffer.write(pickle.dumps(out))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
    assert run.returncode == 0, run.stderr.decode()
    for got, want in zip(pickle.loads(run.stdout), encoders["qwen2-vl"].encode_batch(examples), strict=True):
        assert_same(got, want)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), [("qwen2.5-vl", {"max_pixels": 128 * 32 * 32}),
                                               ("qwen3-vl", {"max_pixels": 128 * 32 * 32}), ("molmo2", {})])
def test_encode_batch_videos_equal_general_path(image_root, tmp_path, name, options):
    """Videos beside images, in trees and in linear examples, with the checks' failures (a literal video token,
    a video beside an image where the family refuses it): the batch path equals the general one, one example
    at a time. qwen3-vl splices the video's own timestamped text in (``MediaRun.text``); Molmo2 writes each
    image as its own run of tokens, wrapped, and takes one video per path alone (``video_alone``)."""
    from tests.media.make_videos import write_clip

    clip = write_clip(tmp_path / "clip.mp4", fps=2, frames=4, width=64, height=48)
    video = {"type": "video", "video": str(clip)}
    image = {"type": "image", "image": "img/a.jpg"}
    ask = lambda *parts: {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}  # noqa: E731
    answer = {"role": "assistant", "content": "A grey square."}
    records = [
        {"messages": [ask(video), answer]},
        {"messages": [ask(video), answer, ask(image), answer]},  # Molmo2 refuses it (video_alone)
        {"messages": [ask(video)], "branches": [[answer], [answer, ask(image), answer]]},
        {"messages": [{"role": "user", "content": "a literal <|video_pad|> token"}, answer]},
        {"messages": [ask(image)], "branches": [[{"role": "assistant", "content": "x <|video_pad|>"}], [answer]]},
        {"messages": [ask(image, video), answer]},
    ]
    encoder = Encoder(builtin(get_profile(name).default_tokenizer), get_profile(name, **options))
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    batch = encoder.encode_batch(examples)
    assert sum(isinstance(b, RecordError) for b in batch) >= 2  # the literal tokens, at least
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)


SKIPS_TOOLS = ("{%- for m in messages %}{% if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
               "{% endif %}{% endfor %}")
RUN_ON = "{%- for m in messages %}{{ m.content }}{% endfor %}"  # "ab" + "cd": BPE merges across the branch point


@pytest.mark.parametrize(("template", "reason", "message"), [
    (SKIPS_TOOLS, "template_error", "tree node 2 renders to no tokens"),
    (RUN_ON, "template_error", "tree node 1: the rendering of its parent's path is not a token-level prefix"),
])
def test_tree_template_errors(tok, image_root, template, reason, message):
    """A tree whose node renders to nothing, or whose parent's rendering is not a prefix of the child's: the
    same located error from the batch path and the general one."""
    answer = {"role": "assistant", "content": "Fine."}
    records = [{"messages": [{"role": "user", "content": "ab"}],
                "branches": [[{"role": "assistant", "content": "cd"}], [{"role": "tool", "content": "unseen"}]]},
               {"messages": [{"role": "user", "content": "Hi"}, answer]}]
    encoder = Encoder(tok, get_profile("qwen2-vl"), chat_template=template)
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    batch = encoder.encode_batch(examples)
    assert isinstance(batch[0], RecordError) and batch[0].reason == reason and message in batch[0].message
    assert not isinstance(batch[1], RecordError)
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)


def test_a_branch_whose_tokens_do_not_extend_its_roots_is_the_general_paths(tok, image_root):
    """RUN_ON renders "ab" then "abcd and more": the text extends its root's, its tokens ("abcd", " and", " more")
    do not start with the root's ("ab"), and the branch still has tokens past the root's count, so only the batch
    path's token-level prefix check (``finish._unprefixed``) leaves the record to the general path, which says
    why; the branch that does extend it (" no merge") does not make the record the batch path's."""
    records = [{"messages": [{"role": "user", "content": "ab"}],
                "branches": [[{"role": "assistant", "content": " no merge"}],
                             [{"role": "assistant", "content": "cd and more"}]]},
               {"messages": [{"role": "user", "content": "ab"}], "branches": [[{"role": "assistant", "content": " ok"}]]}]
    encoder = Encoder(tok, get_profile("qwen2-vl"), chat_template=RUN_ON)
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    batch = encoder.encode_batch(examples)
    assert isinstance(batch[0], RecordError) and batch[0].reason == "template_error"
    assert "tree node 2: the rendering of its parent's path is not a token-level prefix" in batch[0].message
    assert not isinstance(batch[1], RecordError)
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)


TRIMS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # alters content: the prefix fallback


def test_encode_batch_prefix_fallback_equals_general_path(tok, image_root):
    """A template that trims content leaves each assistant's content end unknown (templates.py's prefix
    fallback, labels.py's last-special-token rule): the batch path equals the general one, in linear examples,
    trees and ``loss`` overrides, with multi-byte text."""
    user = {"role": "user", "content": "  Grüße?  "}
    records = [
        {"messages": [user, {"role": "assistant", "content": " Hallo 🙂 "}]},
        {"messages": [user, {"role": "assistant", "content": "a\n"}, {"role": "user", "content": "b", "loss": True},
                      {"role": "assistant", "content": "  c", "loss": False}, {"role": "assistant", "content": "d "}]},
        {"messages": [user], "branches": [[{"role": "assistant", "content": " one"}],
                                          [{"role": "assistant", "content": "two  "}, user,
                                           {"role": "assistant", "content": "três"}]]},
    ]
    encoder = Encoder(tok, get_profile("qwen2-vl"), chat_template=TRIMS)
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    assert all(None in [ce for _, ce, _ in spans] for spans in stage(examples[0], encoder._chat, encoder.profile).spans)  # the fallback
    batch = encoder.encode_batch(examples)
    assert not any(isinstance(b, RecordError) for b in batch)
    for got, want in zip(batch, one_by_one(general(encoder), examples), strict=True):
        assert_same(got, want)
