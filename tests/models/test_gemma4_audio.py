"""Gemma 4 audio against transformers 5.23.0's own code: soft-token counts from headers and every example's ids
against ``Gemma4Processor`` (its ``Gemma4AudioFeatureExtractor`` and ``replace_audio_token``) on real clips in
each codec; the numpy features bit-equal to the extractor's; the reader's batch against the extractor; the audio
tower keeping batched clips apart; packed == unpacked on a tiny ``Gemma4ForConditionalGeneration`` with audio.

The reference loader is transformers' ``load_audio(path, 16000, backend="soundfile")`` (what the processor's
``apply_chat_template`` runs without torchcodec; librosa.load's samples); m4a, which soundfile cannot read, and
windows, which it does not take, are loaded by ``packer.media.audio.decode_audio`` (equal to librosa.load:
tests/media/test_audio.py). The tokenizer is the builtin ``gemma4`` STAND-IN (packer/models/gemma4/tokenizers.py).
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers import Gemma4Processor
from transformers.audio_utils import load_audio

from packer.config import BuildConfig
from packer.core.types import AudioRef
from packer.encode.tokenizers import load_tokenizer
from packer.errors import RecordError, ShardError
from packer.media.audio import decode_audio
from packer.models import get_profile
from packer.models.gemma4.audio import batch_features, log_mel, soft_tokens, valid_frames
from packer.pipeline.build import build
from packer.report.verify import verify_build
from packer.train.collate import collate
from packer.train.dataset import PackedDataset
from tests.helpers import tiny_model_report, without_video_processor
from tests.media.audio_clips import signal, write_clip
from tests.models import released
from tests.models.family_checks import leaf_positions

# name -> (rate, seconds, channels, kind): each codec, odd rates and lengths, mono and stereo, one over 30 s
CLIPS = {"a.wav": (22050, 1.3, 2, "speech"), "b.mp3": (44100, 0.83, 1, "tone"), "c.flac": (16000, 2.4, 1, "noise"),
         "d.m4a": (48000, 0.6, 2, "speech"), "e.opus": (48000, 1.1, 1, "speech"), "f.ogg": (11025, 0.7, 2, "tone"),
         "g.wav": (8000, 0.013, 1, "noise"), "h.flac": (16000, 31.0, 1, "tone")}


_Processor = without_video_processor(Gemma4Processor)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("gemma4")


@pytest.fixture(scope="module")
def processor(tok):
    # google/gemma-4-E2B-it processor_config.json: the classes' defaults (audio_seq_length 750, 40 ms a token).
    # A copy of the tokenizer: Gemma4Processor.__init__ resets its additional_special_tokens, and load_tokenizer's
    # cached one is the build's
    return _Processor(feature_extractor=released.audio_extractor("gemma4"), image_processor=released.image_processor("gemma4"),
                      tokenizer=copy.deepcopy(tok), video_processor=None)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-audio")
    (root / "clips").mkdir()
    for i, (name, (rate, seconds, channels, kind)) in enumerate(CLIPS.items()):
        write_clip(root / "clips" / name, signal(kind, rate, seconds, channels=channels, seed=i), rate)
    return root


def _load(path, start=None, end=None) -> np.ndarray:
    """The processor's loader (see the module docstring)."""
    if str(path).endswith(".m4a") or start is not None or end is not None:
        return decode_audio(str(path), target_sr=16000, start=start, end=end)
    return load_audio(str(path), sampling_rate=16000, backend="soundfile")


# ------------------------------------------------------------------ counts and features


@settings(max_examples=25, deadline=None)
@given(st.one_of(st.integers(0, 2_000), st.integers(2_000, 60_000), st.integers(479_000, 481_000)))
def test_count_rule_equals_the_processor(n) -> None:
    """valid_frames / soft_tokens == the extractor's mask and replace_audio_token's count on n samples (zeros:
    the count does not look at the samples), across the 161-sample floor and the 30 s cut."""
    fe = released.audio_extractor("gemma4")
    out = fe([np.zeros(n, dtype=np.float32)], return_tensors="np")
    mask = out["input_features_mask"][0]
    frames = int(valid_frames(np.array([n]))[0])
    assert max(frames, 0) == int(mask.sum())
    if frames > 0:
        assert int(soft_tokens(np.array([frames]))[0]) == int(mask[::2][::2].sum())


def test_features_are_the_extractors() -> None:
    """log_mel bit-equal to Gemma4AudioFeatureExtractor on one clip (odd lengths, the 30 s cut) and batch_features
    bit-equal to its batch (padded to the longest, masked frames zero)."""
    fe = released.audio_extractor("gemma4")
    rng = np.random.default_rng(0)
    ys = [(rng.standard_normal(n) * 0.3).astype(np.float32) for n in (1, 160, 161, 799, 801, 16000, 20811, 480_130)]
    for y in ys:
        want = fe([y], return_tensors="np")
        got = log_mel(y)
        assert np.array_equal(want["input_features"][0], got.features) and want["input_features"].dtype == np.float32
        assert np.array_equal(want["input_features_mask"][0], got.mask)
    want = fe(ys[3:7], return_tensors="np")
    features, mask = batch_features([log_mel(y) for y in ys[3:7]])
    assert np.array_equal(want["input_features"], features) and np.array_equal(want["input_features_mask"], mask)


@pytest.mark.slow
def test_counts_from_headers_equal_the_processor(clips, tok, processor) -> None:
    """Each clip's run from its header (and a window of one) == the processor's expansion of one <|audio|> on the
    loader's samples: <|audio> + soft tokens + <audio|>."""
    profile = get_profile("gemma4")
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|audio>", "<|audio|>", "<audio|>")}
    cases = [(n, None, None) for n in CLIPS if n != "g.wav"] + [("c.flac", 0.45, 1.9), ("a.wav", 0.1, None)]
    for name, start, end in cases:
        path = str(clips / "clips" / name)
        ref = AudioRef(path=path, start=start, end=end)
        run = profile.audio.run(profile.audio.plan(ref))
        samples = _load(path, start, end)
        assert run.audio.num_samples == len(samples), name
        out = processor(text=["<|audio|>"], audio=[samples], add_special_tokens=False, return_tensors="np")
        want = out["input_ids"][0].tolist()
        assert [tok.convert_tokens_to_ids(t) for t in run.tokens] == want, name
        assert want[1:-1] == [ids["<|audio|>"]] * run.num_tokens and run.lead == 1
        assert run.audio.feature_length == int(out["input_features_mask"][0].sum())
    long = profile.audio.run(profile.audio.plan(AudioRef(path=str(clips / "clips" / "h.flac"))))
    assert long.num_tokens == 750 and long.audio.num_samples == 31 * 16000  # the extractor cuts it to 30 s


def test_a_clip_under_one_frame_is_refused(tmp_path) -> None:
    """13 ms at 8 kHz -> 208 samples at 16 kHz: one frame, one token; 10 ms -> 160 samples: none, bad_audio (the
    processor would write <|audio><audio|> and the tower give nothing)."""
    profile = get_profile("gemma4")
    rate, seconds, channels, kind = CLIPS["g.wav"]
    write_clip(tmp_path / "g.wav", signal(kind, rate, seconds, channels=channels), rate)
    ref = AudioRef(path=str(tmp_path / "g.wav"))
    assert profile.audio.run(profile.audio.plan(ref)).num_tokens == 1
    short = tmp_path / "short.wav"
    write_clip(short, signal("noise", 16000, num_samples=160), 16000)
    ref = AudioRef(path=str(short))
    with pytest.raises(RecordError) as e:
        profile.audio.run(profile.audio.plan(ref))
    assert e.value.reason == "bad_audio" and "short.wav" in str(e.value)


def test_a_videos_sound_track_is_refused() -> None:
    """use_audio_in_video: Gemma4Processor lays out no video with its sound, so the profile refuses the track."""
    from packer.models.base import Media

    profile = get_profile("gemma4")
    track = AudioRef(path="clip.mp4", video=True)
    with pytest.raises(RecordError, match="sound track") as e:
        profile.media_runs([Media(track, 0)], np.array([-1]))
    assert e.value.reason == "unsupported_medium"


# ------------------------------------------------------------------ a build against the processor

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
T = lambda t: {"type": "text", "text": t}  # noqa: E731


def _records() -> list[dict]:
    au = lambda n, **w: {"type": "audio", "audio": f"clips/{n}", **w}  # noqa: E731
    return [
        {"messages": [U([au("a.wav"), T("Transcribe.")]), A("Words.")]},
        {"messages": [U([T("Hear "), au("b.mp3"), {"type": "image", "image": "img.png"}, T("Match?")]), A("No.")]},
        {"messages": [U([au("c.flac", audio_start=0.45, audio_end=1.9), T("What is it?")])],
         "branches": [[A("A hiss.")], [A("Noise."), U([au("d.m4a"), T("And this?")]), A("Speech.")]]},
        {"messages": [U("Count to three."), A("1 2 3.")]},
        {"messages": [U([au("e.opus"), au("f.ogg"), T("Same voice?")]), A("Yes.")]},
        {"messages": [U([{"type": "image", "image": "img.png"}, T("Describe.")]), A("Pixels.")]},
    ]


def _path_messages(record: dict) -> list[list[dict]]:
    def walk(prefix, node):
        msgs = prefix + (node if isinstance(node, list) else node["messages"])
        branches = [] if isinstance(node, list) else node.get("branches", [])
        return [p for b in branches for p in walk(msgs, b)] or [msgs]

    return walk([], record)


@pytest.fixture(scope="module")
def built(clips):
    root = clips
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (300, 500, 3), dtype=np.uint8)).save(root / "img.png")
    records = _records()
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)
    config = BuildConfig.from_inputs([str(root / "data.jsonl")], str(out), profile="gemma4", max_length=400,
                                     rows_per_shard=2)
    result = build(config, progress=False)
    return {"root": root, "records": records, "result": result, "rows": list(PackedDataset(out, shuffle=False))}


@pytest.mark.slow
def test_build_equals_the_processor(built, tok, processor) -> None:
    """Every root-to-leaf path of every example == Gemma4Processor's input_ids for that path's conversation (its
    clips on the loader's samples, its images), the audio entries on its audio tokens; the build verifies."""
    assert built["result"].manifest["totals"]["rejected"] == 0, (built["root"] / "out" / "rejects.jsonl").read_text()
    out = built["root"] / "out"
    assert verify_build(out, inputs=[str(built["root"] / "data.jsonl")]).ok
    rows, root = built["rows"], built["root"]
    assert any(len(r["example_ids"]) > 1 and len(r["audios"]) for r in rows)
    aud = tok.convert_tokens_to_ids("<|audio|>")
    seen = 0
    for row in rows:
        stored = np.zeros(len(row["input_ids"]), dtype=bool)
        for a in row["audios"]:
            stored[a["offset"] : a["offset"] + a["num_tokens"]] = True
        assert np.array_equal(stored, row["input_ids"] == aud)
        for e, example_id in enumerate(row["example_ids"]):
            record = built["records"][int(example_id.rsplit(":", 1)[1]) - 1]
            got = leaf_positions(row, e)
            paths = _path_messages(record)
            assert len(got) == len(paths)
            for positions, path in zip(got, paths, strict=True):
                msgs, audio, images = [], [], []
                for m in path:
                    if isinstance(m["content"], str):
                        msgs.append(m)
                        continue
                    for p in m["content"]:
                        if p["type"] == "audio":
                            audio.append(_load(root / p["audio"], p.get("audio_start"), p.get("audio_end")))
                        elif p["type"] == "image":
                            images.append(Image.open(root / p["image"]).convert("RGB"))
                    msgs.append({**m, "content": [{"type": p["type"]} if p["type"] != "text" else p
                                                  for p in m["content"]]})
                text = tok.apply_chat_template(msgs, tokenize=False)
                kwargs = {"audio": audio} if audio else {}
                if images:
                    kwargs["images"] = [images]
                want = processor(text=[text], add_special_tokens=False, return_tensors="np", **kwargs)
                assert row["input_ids"][positions].tolist() == want["input_ids"][0].tolist(), (example_id, path)
                seen += 1
    assert seen == 1 + 1 + 2 + 1 + 1 + 1


@pytest.mark.slow
@pytest.mark.parametrize(("field", "by"), [("num_tokens", 1), ("feature_length", 1), ("num_samples", 160)])
def test_verify_checks_gemma4s_audio_rule(built, tmp_path, field, by) -> None:
    """verify recomputes a clip's frames from its samples and its tokens from its frames by Gemma 4's rule: one
    soft token, one frame or one frame's samples more is reported."""
    from tests.report.test_verify import _mutate

    copy = tmp_path / "out"
    shutil.copytree(built["root"] / "out", copy)
    _mutate(copy, lambda r: bool(r["audios"]), lambda r: r["audios"][0].__setitem__(field, r["audios"][0][field] + by))
    report = verify_build(copy)
    assert not report.ok and any("audio" in v.what for v in report.violations), report.violations[:4]


@pytest.mark.slow
def test_reader_equals_the_extractor(built) -> None:
    """The batch's input_features / input_features_mask == the extractor's batch of the rows' clips (the build's
    samples), bit-equal; audio_offsets on each clip's first soft token; a changed file is refused."""
    rows = built["rows"]
    batch = collate(rows)
    clips = [a for r in rows for a in r["audios"]]
    samples = [decode_audio(a["source"], target_sr=16000, start=a["audio_start"], end=a["audio_end"]) for a in clips]
    want = released.audio_extractor("gemma4")(samples, return_tensors="pt")
    assert torch.equal(batch["input_features"], want["input_features"])
    assert torch.equal(batch["input_features_mask"], want["input_features_mask"])
    ids = batch["input_ids"][0]
    aud = int(ids[batch["audio_offsets"][0]])
    for off, a in zip(batch["audio_offsets"].tolist(), clips, strict=True):
        assert int(ids[off - 1]) != aud and bool((ids[off : off + a["num_tokens"]] == aud).all())
    reader = get_profile("gemma4").reader()
    # a clip stored inline (a datasets.Audio cell's bytes) reads as its file does
    inline = {**clips[1], "source": "", "data": open(clips[1]["source"], "rb").read()}  # noqa: SIM115
    assert torch.equal(reader.audio_inputs([inline])["input_features"][0], reader.audio_inputs([clips[1]])["input_features"][0])
    with pytest.raises(ShardError, match="the build counted"):
        reader.audio_inputs([{**clips[0], "num_samples": clips[0]["num_samples"] + 1}])


# ------------------------------------------------------------------ the model


def _tiny(tok):
    from scripts import check_equivalence as ce

    profile = get_profile("gemma4")
    token_ids = ce.profile_token_ids(profile, tok)
    return profile, token_ids, ce


@pytest.mark.slow
def test_audio_tower_keeps_batched_clips_apart(tok) -> None:
    """Gemma4AudioModel encodes each clip of a batch as a row of its own: a clip's valid soft tokens from the
    extractor's batch of it with longer clips equal them from the clip alone, and changing another clip changes
    nothing of it (measured: differences of float32 rounding, below 1e-5)."""
    profile, token_ids, ce = _tiny(tok)
    model = profile.proof().tiny_model(token_ids=token_ids, vocab_size=max(token_ids.values()) + 1).eval()
    fe = released.audio_extractor("gemma4")
    rng = np.random.default_rng(0)
    ys = [(rng.standard_normal(n) * 0.3).astype(np.float32) for n in (3201, 16000, 9000)]
    with torch.no_grad():
        def tokens(batch):
            out = model.model.get_audio_features(torch.from_numpy(batch["input_features"]),
                                                 torch.from_numpy(batch["input_features_mask"]), return_dict=True)
            return [h[m] for h, m in zip(out.pooler_output, out.attention_mask, strict=True)]

        together = tokens(fe(ys, return_tensors="np"))
        other = tokens(fe([ys[0], ys[1][::-1].copy(), ys[2]], return_tensors="np"))
        for i, y in enumerate(ys):
            alone = tokens(fe([y], return_tensors="np"))[0]
            assert alone.shape[0] == int(soft_tokens(valid_frames(np.array([len(y)])))[0])
            torch.testing.assert_close(together[i], alone, rtol=0, atol=1e-5)
        torch.testing.assert_close(other[0], together[0], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_packed_equals_unpacked_with_audio(built, tok) -> None:
    """Rows mixing audio clips, images, text and a tree with a clip in a branch: per-token losses, the total and
    every gradient of a tiny Gemma4ForConditionalGeneration equal each root-to-leaf path run alone as the
    processor gives it (that path's clips alone; padded to the batch's longest, which the tower test shows
    changes none of their tokens)."""
    profile = get_profile("gemma4")
    with released.released_reader(profile):  # the released image processor and extractor, not the profile's
        batch = collate(built["rows"])
    _, model = tiny_model_report(profile, tok, batch, paths=7)
    grads = [n for n, p in model.named_parameters() if "audio_tower" in n and p.grad is not None]
    assert grads, "the audio tower took part"
