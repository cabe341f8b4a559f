"""render.py against the real Qwen2-VL tokenizer and template, with hand-derived expectations.

Every expected sequence is built piece by piece: ``tok.encode`` of a known string (a role header, a
content, ``<|im_end|>``), each piece marked loss or not by hand. Pieces are split where the tokenizer
splits anyway (special tokens, newlines), and each linear case is also checked against
``apply_chat_template(tokenize=True)``, so the expectations do not lean on render.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.core.types import IGNORE_INDEX, Example, ImageRef, Message, Node
from packer.encode.renderer import Renderer
from packer.errors import ConfigError, RecordError
from packer.formats import parse_record
from packer.models import get_profile

SYS_DEFAULT = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
IMAGE_PAD = 151655
VISION_START, VISION_END = 151652, 151653


@pytest.fixture(scope="module")
def tok(qwen_tokenizer):
    return qwen_tokenizer


@pytest.fixture(scope="module")
def qwen(tok) -> Renderer:
    return Renderer(tok, get_profile("qwen2-vl"))


@pytest.fixture(scope="module")
def img(coco_dir: Path) -> Path:
    return coco_dir / "val2017" / "000000397133.jpg"  # 640x427


class Seq:
    """Expected (ids, labels) built from pieces: ``add(text, loss)`` tokenizes one known string."""

    def __init__(self, tok):
        self.tok = tok
        self.ids: list[int] = []
        self.labels: list[int] = []

    def add(self, text: str, loss: bool = False) -> Seq:
        ids = self.tok.encode(text, add_special_tokens=False)
        self.ids += ids
        self.labels += ids if loss else [IGNORE_INDEX] * len(ids)
        return self

    def image(self, n: int) -> Seq:
        self.ids += [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
        self.labels += [IGNORE_INDEX] * (n + 2)
        return self

    def turn(self, role: str, content: str, loss: bool) -> Seq:
        """<|im_start|>role\\n + content + <|im_end|> + \\n; loss on content and <|im_end|>."""
        return self.add(f"<|im_start|>{role}\n").add(content, loss).add("<|im_end|>", loss).add("\n")

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        labels = np.array(self.labels, dtype=np.int32)
        labels[:1] = IGNORE_INDEX
        return np.array(self.ids, dtype=np.int32), labels


def example(rec: dict, base_dir: Path | str = "/") -> Example:
    return parse_record(rec, path="t.jsonl", line=3, base_dir=str(base_dir))


def msg(role: str, content, **kw) -> dict:
    return {"role": role, "content": content, **kw}


def assert_encoded(enc, seq: Seq) -> None:
    ids, labels = seq.arrays()
    assert enc.input_ids.dtype == np.int32 and enc.labels.dtype == np.int32
    np.testing.assert_array_equal(enc.input_ids, ids)
    np.testing.assert_array_equal(enc.labels, labels)


# ---------------------------------------------------------------- linear conversations


def test_multi_turn_default_system(tok, qwen):
    msgs = [
        msg("user", "Hi!"),
        msg("assistant", "Hello there."),
        msg("user", "Bye."),
        msg("assistant", "See you."),
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT)
    seq.turn("user", "Hi!", False).turn("assistant", "Hello there.", True)
    seq.turn("user", "Bye.", False).turn("assistant", "See you.", True)
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )
    np.testing.assert_array_equal(enc.position_ids, np.arange(enc.num_tokens))
    np.testing.assert_array_equal(enc.mrope_position_ids, np.tile(np.arange(enc.num_tokens), (3, 1)))
    assert enc.node_offsets.tolist() == [0] and enc.node_parents.tolist() == [-1] and enc.images == []
    assert enc.example_id == "t.jsonl:3"
    assert enc.num_loss_tokens == len(tok.encode("Hello there.See you.")) + 2


def test_system_prompt_and_multiline_content(tok, qwen):
    msgs = [
        msg("system", "Answer in French."),
        msg("user", "Count:\n1, 2"),
        msg("assistant", "Un,\n deux\n\n"),  # trailing newlines are content: they carry loss
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).turn("system", "Answer in French.", False).turn("user", "Count:\n1, 2", False)
    seq.turn("assistant", "Un,\n deux\n\n", True)
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )


def test_loss_overrides(tok, qwen):
    msgs = [
        msg("user", "Teach me.", loss=True),
        msg("assistant", "Old answer.", loss=False),
        msg("user", "Again."),
        msg("assistant", "New answer."),
    ]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT).turn("user", "Teach me.", True).turn("assistant", "Old answer.", False)
    seq.turn("user", "Again.", False).turn("assistant", "New answer.", True)
    assert_encoded(enc, seq)


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
        enc = Renderer(tok, profile).encode(example(rec))
        sizes = [Image.open(p).size for p in files]
        want = [profile.num_tokens(w, h) for w, h in sizes]
        assert [im.num_tokens for im in enc.images] == want
        assert [im.grid_thw for im in enc.images] == [profile.grid_thw(w, h) for w, h in sizes]
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


def test_branch_first_token_is_loss_token(tok):
    """With a template that has no role headers, a branch's first token is content and carries loss:
    it is predicted from the parent's last token."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>{{ m['content'] }}<|im_end|>"
        "{% else %}{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
    )
    r = Renderer(tok, get_profile("text"), chat_template=template)
    rec = {"messages": [msg("user", "Q")], "branches": [[msg("assistant", "Yes")], [msg("assistant", "No")]]}
    enc = r.encode(example(rec))
    root = Seq(tok).add("<|im_start|>").add("Q").add("<|im_end|>")
    b1 = Seq(tok).add("Yes", True).add("<|im_end|>", True)
    b2 = Seq(tok).add("No", True).add("<|im_end|>", True)
    assert_encoded(
        enc,
        Seq(tok)
        .add("<|im_start|>Q<|im_end|>")
        .add("Yes", True)
        .add("<|im_end|>", True)
        .add("No", True)
        .add("<|im_end|>", True),
    )
    assert enc.node_offsets.tolist() == [0, len(root.ids), len(root.ids) + len(b1.ids)]
    assert enc.labels[enc.node_offsets[1]] == b1.ids[0] and enc.labels[enc.node_offsets[2]] == b2.ids[0]
    assert enc.mrope_position_ids is None


# ---------------------------------------------------------------- templates


def test_trimming_template_uses_prefix_fallback(tok):
    """A template that trims content defeats the content markers; the prefix method gives the same labels."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = Renderer(tok, get_profile("text"), chat_template=template)
    enc = r.encode(
        example({"messages": [msg("user", " Hi "), msg("assistant", "  Yes.\n"), msg("user", "Ok")]})
    )
    seq = Seq(tok).turn("user", "Hi", False).turn("assistant", "Yes.", True).turn("user", "Ok", False)
    assert_encoded(enc, seq)


def test_not_prefix_stable_tree(tok):
    template = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}<|im_end|>{% endif %}{% endfor %}"
    r = Renderer(tok, get_profile("text"), chat_template=template)
    rec = {"messages": [msg("user", "Q")], "branches": [[msg("assistant", "A")]]}
    with pytest.raises(
        RecordError, match=r"^t.jsonl:3: template_error: tree node 1: .* not a token-level prefix"
    ):
        r.encode(example(rec))


def test_template_errors(tok):
    r = Renderer(tok, get_profile("text"), chat_template="{{ raise_exception('only user turns') }}")
    with pytest.raises(
        RecordError, match=r"template_error: the chat template failed: TemplateError: only user turns"
    ):
        r.encode(example({"messages": [msg("user", "x"), msg("assistant", "y")]}))
    with pytest.raises(ConfigError, match=r"the chat template does not compile"):
        Renderer(tok, get_profile("text"), chat_template="{% for %}")
    with pytest.raises(ConfigError, match=r"'overlong' must be one of drop, truncate"):
        Renderer(tok, get_profile("text"), overlong="cut")


def test_template_dropping_images(tok, img):
    template = "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% endif %}<|im_end|>{% endfor %}"
    r = Renderer(tok, get_profile("qwen2-vl"), chat_template=template)
    with pytest.raises(
        RecordError, match=r"template_error: the chat template emitted 0 image tokens for 1 images"
    ):
        r.encode(
            example(
                {"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]}
            )
        )


# ---------------------------------------------------------------- rejects


def test_no_loss_tokens(qwen):
    with pytest.raises(RecordError, match=r"^t.jsonl:3: no_loss_tokens: no token carries loss"):
        qwen.encode(example({"messages": [msg("user", "Just a question.")]}))
    with pytest.raises(RecordError, match=r"no_loss_tokens"):
        qwen.encode(example({"messages": [msg("user", "q"), msg("assistant", "a", loss=False)]}))


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
    r = Renderer(tok, get_profile("text"))
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
    full = Renderer(tok, get_profile("qwen2-vl")).encode(image_chat(img))
    L = full.num_tokens
    assert Renderer(tok, get_profile("qwen2-vl"), max_length=L).encode(image_chat(img)).num_tokens == L
    with pytest.raises(RecordError, match=rf"^t.jsonl:3: overlong: {L} tokens > --max-length {L - 1}$"):
        Renderer(tok, get_profile("qwen2-vl"), max_length=L - 1).encode(image_chat(img))


def test_truncate_cuts_before_image(tok, img):
    full = Renderer(tok, get_profile("qwen2-vl")).encode(image_chat(img))
    off = full.images[0].offset
    head = Seq(tok).add(SYS_DEFAULT).turn("user", "Hi", False).turn("assistant", "Hello there.", True)
    head.add("<|im_start|>user\n")
    assert off == len(head.ids) + 1  # the <|vision_start|> sits between
    for max_length in (off + 1, off + 200, off + 344):  # inside the image: cut before <|vision_start|>
        enc = Renderer(tok, get_profile("qwen2-vl"), max_length=max_length, overlong="truncate").encode(
            image_chat(img)
        )
        assert_encoded(enc, head)
        assert enc.images == [] and enc.node_offsets.tolist() == [0]
        np.testing.assert_array_equal(enc.mrope_position_ids, np.tile(np.arange(len(head.ids)), (3, 1)))
    # cutting right after the image keeps it whole
    enc = Renderer(tok, get_profile("qwen2-vl"), max_length=off + 345, overlong="truncate").encode(
        image_chat(img)
    )
    assert enc.num_tokens == off + 345 and len(enc.images) == 1
    np.testing.assert_array_equal(enc.labels, full.labels[: off + 345])
    np.testing.assert_array_equal(enc.mrope_position_ids, full.mrope_position_ids[:, : off + 345])
    # cutting inside the last answer keeps its first tokens with their loss
    enc = Renderer(tok, get_profile("qwen2-vl"), max_length=full.num_tokens - 3, overlong="truncate").encode(
        image_chat(img)
    )
    np.testing.assert_array_equal(enc.labels, full.labels[:-3])


def test_truncate_tree_drops_later_nodes(tok, qwen):
    full = qwen.encode(example(tree_record()))
    cut = int(full.node_offsets[3]) + 2  # two tokens into node 3 (the nested "Why?" branch)
    enc = Renderer(tok, get_profile("qwen2-vl"), max_length=cut, overlong="truncate").encode(
        example(tree_record())
    )
    assert enc.node_offsets.tolist() == full.node_offsets[:4].tolist()
    assert enc.node_parents.tolist() == [-1, 0, 0, 2]
    np.testing.assert_array_equal(enc.input_ids, full.input_ids[:cut])
    np.testing.assert_array_equal(enc.labels, full.labels[:cut])
    np.testing.assert_array_equal(enc.position_ids, full.position_ids[:cut])
    # a cut exactly at a node start drops that node
    at = int(full.node_offsets[3])
    enc = Renderer(tok, get_profile("qwen2-vl"), max_length=at, overlong="truncate").encode(
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
    r = Renderer(tok, get_profile("qwen2-vl"), max_length=100, overlong="truncate")
    with pytest.raises(
        RecordError, match=r"^t.jsonl:3: untruncatable: cutting to --max-length 100 \(at token 14, "
    ):
        r.encode(example(rec))
    with pytest.raises(RecordError, match=r"untruncatable"):
        Renderer(tok, get_profile("qwen2-vl"), max_length=3, overlong="truncate").encode(
            example({"messages": [msg("user", "A long question here."), msg("assistant", "ok")]})
        )


def test_hand_built_example_without_records(tok, qwen):
    """Renderer works on any Example (not only parse_record's), e.g. a single-node tree built in code."""
    ex = Example(
        root=Node([Message("user", ["a"]), Message("assistant", ["b"])]), kind="messages", path="p", line=1
    )
    enc = qwen.encode(ex)
    assert enc.num_loss_tokens == 2 and enc.images == []
    assert ImageRef(path="x") != ImageRef(path="y")


def test_marker_transparency_is_decided_per_template(tok, qwen):
    """Qwen2-VL's template renders marked content exactly like plain content: one rendering per conversation.
    A trimming template is not, so each record is rendered twice and checked."""
    trim = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}<|im_end|>{% endfor %}"
    assert qwen._verify is False
    assert Renderer(tok, get_profile("text"), chat_template=trim)._verify is True


def test_renderer_pickles(qwen, img):
    """Worker processes receive the Renderer pickled; it must encode identically there."""
    import pickle

    ex = example({"messages": [msg("user", [{"type": "image", "image": str(img)}]), msg("assistant", "y")]})
    a, b = qwen.encode(ex), pickle.loads(pickle.dumps(qwen)).encode(ex)
    np.testing.assert_array_equal(a.input_ids, b.input_ids)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.mrope_position_ids, b.mrope_position_ids)


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


def test_token_straddling_content_edges(tok, qwen):
    """A token that overlaps content carries loss (documented rule): multi-byte characters split into several
    byte tokens at the content's end, and a newline run that BPE merges across the header/content edge."""
    msgs = [msg("user", "Draw 𝄞"), msg("assistant", "𝄞 snow 𝄞")]
    enc = qwen.encode(example({"messages": msgs}))
    assert_encoded(
        enc, Seq(tok).add(SYS_DEFAULT).turn("user", "Draw 𝄞", False).turn("assistant", "𝄞 snow 𝄞", True)
    )
    # one character, several byte tokens at both content edges: all of them trained
    assert (
        len(tok.encode("𝄞", add_special_tokens=False)) == 2
        and len(tok.encode(" 𝄞", add_special_tokens=False)) == 3
    )
    # "assistant\n" + "\n\nHi": the three newlines are one token, which overlaps the content -> loss
    msgs = [msg("user", "q"), msg("assistant", "\n\nHi")]
    enc = qwen.encode(example({"messages": msgs}))
    seq = Seq(tok).add(SYS_DEFAULT).turn("user", "q", False).add("<|im_start|>assistant")
    seq.add("\n\n\nHi", True).add("<|im_end|>", True).add("\n")
    assert_encoded(enc, seq)
    np.testing.assert_array_equal(
        enc.input_ids, tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    )
