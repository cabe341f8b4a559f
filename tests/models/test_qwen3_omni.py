"""Qwen3-Omni (thinker) against transformers 5.23.0's own code: the builtin tokenizer against the released
config's ids and what ``Qwen3OmniMoeProcessor`` reads off it; audio counts against the processor on clips alone
and beside longer ones (its per-call padding); the layout of a video with its sound against the processor's
``replace_video_with_audio_token``; float32 positions against the thinker's ``get_rope_index`` on random
sequences and on every root-to-leaf path of trees; then every path of real records (ids, features, positions),
packed == unpacked on ``Qwen3OmniMoeThinkerForConditionalGeneration``, and a build that verifies.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from transformers import (
    Qwen3OmniMoeProcessor,
    Qwen3OmniMoeThinkerConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoePreTrainedModelForConditionalGeneration as OmniModel,
)
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    _get_feat_extract_output_lengths as released_tokens,
)

from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError
from packer.models.qwen_omni.qwen3 import path_padding
from packer.models.qwen_omni.rope import Block
from packer.models.qwen_omni.rope3 import (
    audio_tokens,
    frames_for_tokens,
    layout,
    mel_frames,
    omni3_position_ids,
)
from packer.shards.io import read_shard
from tests import helpers as th
from tests.models import released

IMG, VID, AUD, VS, VE, AS, AE = 151655, 151656, 151675, 151652, 151653, 151669, 151670
HALF = [0.5, 0.5, 0.5]
TOKENS = dict(image=IMG, video=VID, audio=AUD, vision_start=VS, vision_end=VE, audio_start=AS, audio_end=AE)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3-omni")


class _Processor(Qwen3OmniMoeProcessor):
    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor":  # the torchvision-free copy of Qwen2VLVideoProcessor
            return type(argument)
        return super().check_argument_for_proper_class(argument_name, argument)


@pytest.fixture(scope="module")
def processor(tok):
    """Qwen3OmniMoeProcessor as Qwen3-Omni's preprocessor_config builds it: Qwen2VL image and video processors
    with 16 px patches and mean/std 0.5, WhisperFeatureExtractor from the released file
    (tests/models/released/qwen_omni.json)."""
    video, mp = th.qwen2vl_video_processor(patch_size=16, image_mean=HALF, image_std=HALF, cap_pixels_per_frame=False)
    yield _Processor(image_processor=released.image_processor("qwen3-omni"),
                     video_processor=video, tokenizer=tok,
                     feature_extractor=released.audio_extractor("qwen3-omni"),
                     chat_template=tok.chat_template)
    mp.undo()


@pytest.fixture(scope="module")
def rope_model():
    """The thinker's get_rope_index bound to the released thinker_config's ids (vision_start_token_id is a
    checkpoint key the config class does not define)."""
    config = Qwen3OmniMoeThinkerConfig(audio_token_id=AUD, audio_start_token_id=AS, position_id_per_seconds=13)
    config.vision_start_token_id = VS
    ns = types.SimpleNamespace(config=config, spatial_merge_size=2)
    ns.get_llm_pos_ids_for_vision = lambda *a: OmniModel.get_llm_pos_ids_for_vision(ns, *a)
    return lambda *a: OmniModel.get_rope_index(ns, *a)


# ------------------------------------------------------------------ the tokenizer


def test_tokenizer_ids(tok, processor) -> None:
    assert tok("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE, which Qwen3 kept
    assert tok.convert_tokens_to_ids(["<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
                                      "<tts_text_eod>", "<|audio_pad|>"]) == [AS, AE, 151671, 151672, 151673, AUD]
    assert tok.convert_tokens_to_ids(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                                      "<think>", "</think>"]) == [IMG, VID, VS, VE, 151667, 151668]
    assert len(tok) == 151676
    assert (processor.audio_token_id, processor.image_token_id, processor.video_token_id) == (AUD, IMG, VID)
    assert (processor.audio_bos_token, processor.vision_eos_token) == ("<|audio_start|>", "<|vision_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_template_renders_each_medium(processor) -> None:
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "image", "image": "i.png"},
                                         {"type": "video", "video": "v.mp4"}, {"type": "text", "text": "what?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]
    assert processor.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>what?<|im_end|>\n<|im_start|>assistant\na dog<|im_end|>\n"
    )


# ------------------------------------------------------------------ audio counts


SAMPLE_COUNTS = [201, 320, 321, 480, 799, 1600, 15999, 16000, 16001, 16161, 40000, 123457, 480001, 560000]


def test_token_rule_is_the_released_one() -> None:
    frames = np.arange(0, 5000)
    np.testing.assert_array_equal(audio_tokens(frames), released_tokens(frames, 50))
    c = np.arange(1, 800)
    np.testing.assert_array_equal(audio_tokens(frames_for_tokens(c)), c)


@pytest.mark.slow
def test_audio_counts_equal_the_processor(processor) -> None:
    """Clips alone and in pairs and threes in one call: each clip's mask length is ``mel_frames(n, longest)``
    and its run of <|audio_pad|> is ``audio_tokens`` of it."""
    rng = np.random.default_rng(0)
    calls = [[n] for n in SAMPLE_COUNTS] + [[16001, 32000], [32000, 16001], [15999, 16001, 16000], [100, 30000],
                                            [16001, 16100], [560000, 321, 479999]]
    for counts in calls:
        msgs = [{"role": "user", "content": [*({"type": "audio", "audio": f"{i}.wav"} for i in range(len(counts))),
                                             {"type": "text", "text": "hi"}]}]
        text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        clips = [rng.standard_normal(n).astype(np.float32) for n in counts]
        out = processor(text=text, audio=clips, return_tensors="np")
        frames = out["feature_attention_mask"].sum(-1).tolist()
        assert mel_frames(counts, max(counts)).tolist() == frames, counts
        runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], out["input_ids"][0] == AUD, [0]]))))[::2]
        assert audio_tokens(frames).tolist() == runs.tolist(), counts
    assert mel_frames(16001, 16001) == 100 and mel_frames(16001, 32000) == 101


def test_path_padding() -> None:
    """A linear example pads every clip to its longest; a tree pads a clip to its paths' longest, one number."""
    assert path_padding([0, 0, 0], [10, 30, 20], np.array([-1])) == [30, 30, 30]
    # root clip 500, branch 1 a 900 clip, branch 2 none: the root clip is 900 on one path and 500 on the other
    with pytest.raises(RecordError, match="padded to \\[500, 900\\]") as e:
        path_padding([0, 1], [500, 900], np.array([-1, 0, 0]))
    assert e.value.reason == "audio_tree"
    # both branches hold a clip no longer than the root's: every path pads to the root clip
    assert path_padding([0, 1, 2], [900, 500, 300], np.array([-1, 0, 0])) == [900, 900, 900]
    # clips only in the branches: each its own path
    assert path_padding([1, 2], [500, 300], np.array([-1, 0, 0])) == [500, 300]


# ------------------------------------------------------------------ a video with its sound


@pytest.mark.parametrize(("grid", "spg", "n"), [
    ((1, 4, 4), 2.0, 3), ((3, 4, 6), 2.0, 60), ((10, 2, 2), 1.0, 250), ((5, 4, 4), 0.5, 40), ((7, 2, 4), 1.0, 7),
    ((6, 2, 2), 2 / 3, 100), ((4, 6, 2), 1.0428, 130), ((2, 2, 2), 2.0, 1), ((9, 2, 2), 0.6667, 500),
])
def test_layout_equals_the_processor(processor, grid, spg, n) -> None:
    video_inputs = {"video_grid_thw": np.array([grid]), "video_second_per_grid": [spg]}
    real = processor.video_processor
    processor.video_processor = types.SimpleNamespace(merge_size=2)  # the one attribute the method reads
    try:
        text = processor.replace_video_with_audio_token(video_inputs, 0, {"num_audio_tokens": np.array([n])}, 0,
                                                        position_id_per_seconds=13.0)
    finally:
        processor.video_processor = real
    want = processor.tokenizer(text).input_ids
    assert [AS, *np.where(layout(grid, spg, n) == 0, VID, AUD).tolist(), AE] == want


# ------------------------------------------------------------------ positions


def _random_sequence(rng, with_sound: bool):
    # second_per_grid 2 / fps for the fps a user hands on: 1.0 (the default), 2.0, and sampled rates' fractions
    return th.random_omni_sequence(
        rng, with_sound, tokens=TOKENS, frames_for=frames_for_tokens, av_kinds=layout,
        seconds_per_grid=(2.0, 1.0, 0.5, 2 / 1.9178, 2 / 2.3, 2 / 0.7))


def _reference(rope_model, ids, igr, vgr, spg, aud, with_sound) -> np.ndarray:
    x = torch.tensor([ids])
    t = lambda v: torch.tensor(v) if v else None  # noqa: E731
    pos, _ = rope_model(x, t(igr), t(vgr), torch.ones_like(x), with_sound, t(aud), t(spg))
    assert pos.dtype == torch.float32
    return pos[:, 0].numpy()


@pytest.mark.parametrize("with_sound", [False, True])
def test_positions_equal_get_rope_index(rope_model, with_sound) -> None:
    """Bit-equal float32, fractional times included."""
    rng = np.random.default_rng(1 + with_sound)
    checked = fractional = 0
    for _ in range(150):
        ids, blocks, igr, vgr, spg, aud = _random_sequence(rng, with_sound)
        if not igr and not vgr:
            continue  # get_rope_index's 1-D branch (text and audio alone): 0..L-1, which the positions rule gives
        got = omni3_position_ids(len(ids), np.array([0]), np.array([-1]), blocks)
        want = _reference(rope_model, ids, igr, vgr, spg, aud, with_sound)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        checked += 1
        fractional += bool((want != np.round(want)).any())
    assert checked > 100 and fractional > 30


@pytest.mark.parametrize("with_sound", [False, True])
def test_positions_on_trees(rope_model, with_sound) -> None:
    """A root and two branches, each a random sequence: every root-to-leaf path equals get_rope_index on it alone."""
    rng = np.random.default_rng(7 + with_sound)
    for _ in range(40):
        th.check_omni_tree(rng, with_sound, _random_sequence,
                        lambda ids, offsets, parents, blocks: omni3_position_ids(len(ids), offsets, parents, blocks),
                        lambda *path: _reference(rope_model, *path, with_sound))


# ------------------------------------------------------------------ every path of real records


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return th.write_omni_media(tmp_path_factory.mktemp("omni3"))


def _records() -> list[dict]:
    audio = lambda name, **w: {"type": "audio", "audio": name, **w}  # noqa: E731
    image = lambda name: {"type": "image", "image": name}  # noqa: E731
    video = lambda name, **o: {"type": "video", "video": name, **o}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return [
        # two clips in one example: the shorter is padded to the longer (its mask and features change)
        {"messages": [{"role": "user", "content": [audio("speech.wav"), image("pic.png"), audio("short.m4a"),
                                                   text("What is heard?")]},
                      {"role": "assistant", "content": "Speech, twice."}]},
        # a video with its sound at a user's fps (second_per_grid 2 / 2.3: fractional positions) and a clip
        {"messages": [{"role": "user", "content": [video("movie.mp4", fps=2.3), audio("tone.mp3"), text("Same?")]},
                      {"role": "assistant", "content": "No."}], "use_audio_in_video": True},
        # a tree: the root's clip is each path's longest, so both paths pad alike
        {"messages": [{"role": "user", "content": [audio("noise.flac"), image("tall.png"), text("Describe.")]}],
         "branches": [[{"role": "assistant", "content": "A hiss."}],
                      [{"role": "assistant", "content": "Listen:"},
                       {"role": "user", "content": [audio("short.m4a", audio_start=0.1), text("And this?")]},
                       {"role": "assistant", "content": "Speech."}]]},
        # a silent video at the processor's default fps (second_per_grid 2.0), then a clip
        {"messages": [{"role": "user", "content": [video("long.mp4"), audio("short.m4a"), text("Both?")]},
                      {"role": "assistant", "content": "Yes."}]},
        # audio alone: get_rope_index's 1-D branch
        {"messages": [{"role": "user", "content": [text("Listen: "), audio("tone.mp3")]},
                      {"role": "assistant", "content": "A tone."}]},
        # a fractional video first, then text runs that cross 256, 512 and 1024 across the node boundary and a
        # clip in one branch: float32 rounds the fraction coarser at each power of two, once per piece
        {"messages": [{"role": "user", "content": [video("movie.mp4", fps=2.3), text("Say it all. " * 60)]}],
         "branches": [[{"role": "assistant", "content": "yes " * 300}],
                      [{"role": "assistant", "content": "no " * 250},
                       {"role": "user", "content": [audio("short.m4a"), text("and " * 200)]},
                       {"role": "assistant", "content": "ok"}]],
         "use_audio_in_video": True},
    ]


@pytest.fixture(scope="module")
def encoded(tok, media):
    from packer.models import get_profile

    return th.encode_records(tok, get_profile("qwen3-omni"), _records(), media, path="omni3.jsonl")


@pytest.mark.slow
def test_every_path_equals_the_processor(processor, media, rope_model, encoded) -> None:
    """Each record's every root-to-leaf path: the encoder's ids equal ``Qwen3OmniMoeProcessor(text=
    apply_chat_template(path), audio=the loader's clips, images=..., videos=the sampled frames)["input_ids"]``
    (``load_audio_from_video`` where the record uses a video's sound); its grids, ``video_second_per_grid`` and
    masks; the reader's features of the path's clips equal the processor's (each clip padded to the path's
    longest); the positions equal the thinker's ``get_rope_index`` on the processor's output, float32 bit for bit."""
    import dataclasses

    from packer.models import get_profile

    reader = get_profile("qwen3-omni").reader()
    checked = fractional = 0
    for record, enc in zip(_records(), encoded, strict=True):
        with_sound = bool(record.get("use_audio_in_video"))
        for msgs, cols in zip(th.record_paths(record), th.token_paths(enc), strict=True):
            on_path = set(cols.tolist())
            out, audio, video_entries = th.omni_processor_out(processor, msgs, enc, cols, media, with_sound=with_sound)
            np.testing.assert_array_equal(enc.input_ids[cols], out["input_ids"][0].numpy())
            if video_entries:
                assert out["video_grid_thw"].tolist() == [list(v.grid_thw) for v in video_entries]
                spg = torch.tensor([v.second_per_grid_t for v in video_entries], dtype=torch.float32)
                assert torch.equal(torch.as_tensor(out["video_second_per_grid"], dtype=torch.float32), spg)
            if audio:
                mine = sorted((a for a in enc.audios if a.offset in on_path), key=lambda a: a.offset)
                mask = out["feature_attention_mask"]
                assert [a.feature_length for a in mine] == mask.sum(-1).tolist()
                assert {a.padded_samples for a in mine} == {max(len(y) for y in audio)}
                got = reader.audio_inputs([dataclasses.asdict(a) for a in mine])
                assert torch.equal(got["feature_attention_mask"][:, : mask.shape[1]].bool(), mask.bool())
                for k, a in enumerate(mine):  # float32 STFT (the extractor) against float64 (numpy): 1e-4
                    torch.testing.assert_close(got["input_features"][k, :, : a.feature_length],
                                               out["input_features"][k, :, : a.feature_length], rtol=0, atol=1e-4)
            ref, _ = rope_model(out["input_ids"], out.get("image_grid_thw"), out.get("video_grid_thw"),
                                torch.ones_like(out["input_ids"]), with_sound and bool(video_entries),
                                mask.sum(-1) if audio else None,
                                spg if video_entries else None)
            np.testing.assert_array_equal(enc.mrope_position_ids[:, cols], ref[:, 0].numpy())
            fractional += bool((ref != ref.round()).any())
            checked += 1
    assert checked == 8 and fractional >= 3


def test_a_clip_two_branches_pad_apart_is_rejected(tok, media) -> None:
    """A root clip (1.3 s) under one branch with a longer clip (2.05 s) and one without: Qwen3OmniMoeProcessor
    gives the root clip 2.05 s of padding on one path and none on the other, so its features differ by path."""
    from packer.encode.encoder import Encoder
    from packer.formats import parse_record
    from packer.models import get_profile

    record = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "speech.wav"}]}],
              "branches": [[{"role": "assistant", "content": "One."}],
                           [{"role": "assistant", "content": "Two."},
                            {"role": "user", "content": [{"type": "audio", "audio": "noise.flac"}]},
                            {"role": "assistant", "content": "Three."}]]}
    with pytest.raises(RecordError, match=r"padded to \[\d+, 32800\]") as e:
        Encoder(tok, get_profile("qwen3-omni")).encode(parse_record(record, path="t.jsonl", line=2,
                                                                   base_dir=str(media)))
    assert e.value.reason == "audio_tree"


# ------------------------------------------------------------------ packed == unpacked, build, verify


@pytest.mark.slow
def test_packed_equals_unpacked(tmp_path, encoded, tok) -> None:
    """Rows mixing clips padded together, images, videos with and without their sound, text and a tree, two
    and three examples a row, collated into one batch with float32 positions: per-token losses, the total and
    every gradient of a tiny Qwen3OmniMoeThinkerForConditionalGeneration equal each root-to-leaf path run alone
    through the model's own processing (its get_rope_index, its audio tower on that path's clips alone)."""
    import json

    from packer.models import get_profile
    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset
    from tests.helpers import tiny_model_report, write_shardset

    profile = get_profile("qwen3-omni")
    root = write_shardset(tmp_path / "shards", encoded, [2, 3, 1], profile="qwen3-omni")
    rows = list(PackedDataset(root, shuffle=False))
    with released.released_reader(profile):  # the released image processor and extractor, not the profile's
        batch = collate(rows)
    assert batch["position_ids"].dtype == torch.float32
    assert (batch["position_ids"] != batch["position_ids"].round()).any()  # the fractional video
    report, model = tiny_model_report(profile, tok, batch, paths=8)
    # the figures docs/models/qwen_omni.md quotes (pytest -s prints them)
    print(json.dumps({b: {k: report[b][k] for k in ("loss_max_rel", "total_rel", "grad_max_rel")}
                      for b in ("sdpa_varlen", "sdpa")} | {"tokens": report["tokens"]}))
    for tower in ("audio_tower", "visual"):
        assert [n for n, p in model.named_parameters() if tower in n and p.grad is not None], tower


@pytest.fixture(scope="module")
def omni3_build(media, tmp_path_factory):
    import json

    from packer.config import BuildConfig
    from packer.pipeline.build import build

    root = tmp_path_factory.mktemp("omni3-build")
    data = media / "data.jsonl"  # paths resolve against the input file's directory
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen3-omni", max_length=4096)
    return {"root": root, "data": data, "result": build(config, progress=False)}


@pytest.mark.slow
def test_build_verifies(omni3_build) -> None:
    """Every record packed; verify finds each video with sound as its frames' and its sound's runs in the
    processor's order, each clip's frames under its padded length, and the float32 positions; the shards keep
    each clip's padded length and the fractional positions."""

    from packer.report.verify import verify_build

    out = omni3_build["root"] / "out"
    totals = omni3_build["result"].manifest["totals"]
    assert totals["rejected"] == 0 and totals["examples"] == 6
    report = verify_build(out, inputs=[str(omni3_build["data"])])
    assert report.ok, report.lines()
    table = read_shard(sorted(out.glob("*.parquet"))[0])
    clips = [a for row in table.column("audios").to_pylist() for a in row]
    assert all(a["padded_samples"] >= a["num_samples"] for a in clips)
    assert any(a["padded_samples"] > a["num_samples"] for a in clips)
    positions = np.concatenate([np.asarray(r, np.float32) for r in table.column("mrope_position_ids").to_pylist()])
    assert (positions != np.round(positions)).any()


OMNI3_FAULTS = {**th.SOUND_TRACK_FAULTS, "padding": {"audio plan"}}  # fault -> what verify reports (any of)


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(OMNI3_FAULTS))
def test_verify_finds_each_fault(omni3_build, tmp_path, fault) -> None:
    def change(rows: list[dict]) -> None:
        if fault == "padding":  # a clip that was padded beside a longer one, stored as padded alone
            clip = next(a for r in rows for a in r["audios"] if a["padded_samples"] > a["num_samples"] + 160)
            clip["padded_samples"] = clip["num_samples"]
        else:
            row = next(r for r in rows if any(a["video"] for a in r["audios"]))
            th.break_sound_track(row, fault, audio_id=AUD, position_step=0.5)

    th.assert_verify_finds(omni3_build["root"] / "out", tmp_path, change, OMNI3_FAULTS[fault])


@pytest.mark.slow
def test_check_equivalence_runs_audio(omni3_build) -> None:
    """``scripts/check_equivalence.py --model qwen3-omni``: builds the records, reads their audio, and proves
    packed == unpacked on the real thinker."""
    import contextlib
    import io
    import json

    from scripts import check_equivalence as ce

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = ce.main(["--data", str(omni3_build["data"]), "--model", "qwen3-omni", "--max-length", "4096",
                      "--backend", "sdpa", "--backend", "sdpa_varlen"])
    summary = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert rc == 0 and summary["ok"] and summary["rows"] >= 1, summary


def test_video_family_is_qwen_omni_utils_at_14_then_the_processor_at_16() -> None:
    """qwen-omni-utils resizes as for Qwen2.5 (image_patch_size 14: the ``qwen2.5-vl`` family's utils step, which
    tests/models/test_qwen_video.py checks against qwen-vl-utils); the processor then resizes to multiples of 32
    within its videos_kwargs bounds (the grids above equal Qwen3OmniMoeProcessor's)."""
    from packer.models.shared.qwen_video_plan import (
        VideoRequest,
        get_video_family,
        processor_frame_size,
        utils_frame_size,
    )

    omni3, qwen25 = get_video_family("qwen3-omni"), get_video_family("qwen2.5-vl")
    for nframes, h, w in [(4, 48, 64), (20, 1080, 1920), (8, 60, 80), (300, 720, 1280), (2, 4000, 30)]:
        size = utils_frame_size(VideoRequest(), nframes=nframes, height=h, width=w, family=omni3)
        assert size == utils_frame_size(VideoRequest(), nframes=nframes, height=h, width=w, family=qwen25)
        out = processor_frame_size(nframes=nframes, height=size[0], width=size[1], family=omni3)
        assert out[0] % 32 == 0 and out[1] % 32 == 0
        assert 128 * 32 * 32 <= out[0] * out[1] <= 768 * 32 * 32


@pytest.mark.parametrize("with_sound", [False, True])
def test_positions_where_float32_rounding_changes_binade(rope_model, with_sound) -> None:
    """After a fractional video float32 rounds every sum, and a text run that crosses powers of two rounds its
    fraction coarser at each: a run split where get_rope_index does not split it (at a tree node boundary), or
    a clip taken as text where the model takes it as a block, would round differently. Fractional videos near
    the start, text runs over 256 and 512 spanning the node boundary, clips in the branches: every path
    bit-equal, and verify's rebuild from the stored spans too."""
    from packer.models import get_profile

    profile = get_profile("qwen3-omni")
    rng = np.random.default_rng(11 + with_sound)
    for _ in range(40):
        lead = int(rng.integers(0, 50))
        root = rng.integers(0, 1000, lead).tolist()
        g, sp = (3, 2, 2), float(rng.choice([2 / 1.9178, 2 / 2.3, 2 / 0.7]))
        blocks, vgr, spg, aud = [], [g], [sp], []
        if with_sound:
            n = int(rng.integers(5, 40))
            aud.append(int(frames_for_tokens(n)))
            root += [VS, AS]
            s = len(root)
            root += np.where(layout(g, sp, n) == 0, VID, AUD).tolist()
            blocks.append(Block(s, len(root), "av", g, sp, n))
            root += [AE, VE]
        else:
            root.append(VS)
            s = len(root)
            root += [VID] * 3
            blocks.append(Block(s, len(root), "video", g, sp))
            root.append(VE)
        root += rng.integers(0, 1000, int(rng.integers(100, 400))).tolist()
        parts, ids, offsets = [], list(root), [0]
        for _b in range(2):
            offsets.append(len(ids))
            part, p_aud = rng.integers(0, 1000, int(rng.integers(100, 700))).tolist(), []
            for _c in range(int(rng.integers(1, 3))):
                n = int(rng.integers(1, 80))
                part.append(AS)
                blocks.append(Block(len(ids) + len(part), len(ids) + len(part) + n, "audio"))
                part += [AUD] * n + [AE] + rng.integers(0, 1000, int(rng.integers(0, 40))).tolist()
                p_aud.append(int(frames_for_tokens(n)))
            parts.append((part, p_aud))
            ids += part
        got = omni3_position_ids(len(ids), np.array(offsets), np.array([-1, 0, 0]), blocks)
        if not with_sound:  # verify's rebuild from the stored spans (videos, clips alone) gives the same
            clips = [bl for bl in blocks if bl.kind == "audio"]
            want = profile.positions.expected(
                len(ids), np.array(offsets), np.array([-1, 0, 0]),
                images=dict(offset=np.zeros(0, np.int64), grid=np.zeros((0, 3), np.int64)),
                videos=dict(offset=np.array([blocks[0].start]), grid=np.array([g]), second_per_grid_t=np.array([sp])),
                audios=dict(offset=np.array([c.start for c in clips]),
                            feature_length=frames_for_tokens([c.end - c.start for c in clips]),
                            num_tokens=np.array([c.end - c.start for c in clips]), video=np.zeros(len(clips), bool)))
            np.testing.assert_array_equal(want, got)
        for b, (part, p_aud) in enumerate(parts):
            cols = np.concatenate([np.arange(offsets[1]), np.arange(offsets[b + 1], offsets[b + 1] + len(part))])
            want = _reference(rope_model, [ids[c] for c in cols], [], vgr, spg, aud + p_aud, with_sound)
            assert (want != want.round()).any()
            np.testing.assert_array_equal(got[:, cols], want)
