"""Audio through the encoder, on real clips (tests/media/audio_clips.py): each ``{"type": "audio"}`` part's
placeholder becomes its family's run, counted from the header alone, and the stored entry says what the reader
will decode. The toy family (tests/models/toy_family/) takes audio as a Whisper-style encoder hears it.

The reference for the ids is what a processor does: the chat template's text (``apply_chat_template``),
tokenized, each audio placeholder repeated by the clip's token count; the reference for the counts is the
decoded clip itself (``decode_audio``: what the family's loader yields).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.core.types import IGNORE_INDEX, AudioRef, VideoRef
from packer.encode.encoder import Encoder
from packer.errors import RecordError
from packer.formats import parse_record
from packer.media.audio import decode_audio
from packer.media.video import VideoPlan
from packer.models import get_profile
from packer.models.base import Media, MediaRun
from packer.models.rules import VideoRule
from tests.media.audio_clips import write_four_clips, write_video
from tests.models.toy_family import ToyProfile

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_pad|>{% elif part['type'] == 'video' %}<|video_pad|>"
    "{% elif part['type'] == 'audio' %}Audio: <|quad_start|>\n{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
AUDIO = "<|quad_start|>"


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audio")
    write_four_clips(root)
    (root / "broken.wav").write_bytes(b"RIFF not really a wave file")
    write_video(root / "movie.mp4", seconds=1.5)
    return root


@pytest.fixture(scope="module")
def toy(qwen_tokenizer) -> Encoder:
    return Encoder(qwen_tokenizer, ToyProfile(name="toy"), chat_template=TEMPLATE)


def record(clips: Path, *content, branches=None, **extra) -> object:
    obj = {"messages": [{"role": "user", "content": list(content)}, {"role": "assistant", "content": "Heard it."}],
           **({"branches": branches} if branches else {}), **extra}
    return parse_record(obj, path="speech.jsonl", line=4, base_dir=str(clips))


def audio(name: str, **window) -> dict:
    return {"type": "audio", "audio": name, **window}


def loaded(clips: Path, name: str, start=None, end=None) -> int:
    return int(decode_audio(str(clips / name), target_sr=16000, start=start, end=end).shape[0])


def reference_ids(enc: Encoder, messages: list[dict], counts: list[int]) -> np.ndarray:
    """The processor's way: the template's text tokenized, each audio placeholder repeated by its count."""
    tok = enc.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, chat_template=TEMPLATE)
    ids = np.array(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
    repeats = np.ones(ids.shape[0], dtype=np.int64)
    at = np.flatnonzero(ids == enc.audio_token_id)
    assert len(at) == len(counts)
    repeats[at] = counts
    return np.repeat(ids, repeats)


def test_clips_in_every_codec_become_their_counted_runs(toy, clips):
    names = ["speech.wav", "tone.mp3", "noise.flac", "short.m4a"]
    ex = record(clips, audio(names[0]), {"type": "text", "text": "and"}, audio(names[1]), audio(names[2]),
                {"type": "text", "text": "and "}, audio(names[3]))
    enc = toy.encode(ex)
    profile = toy.profile
    samples = [loaded(clips, n) for n in names]
    assert [a.num_samples for a in enc.audios] == samples  # the header's count is what the loader yields
    frames = [-(-n // 160) for n in samples]  # Whisper's mask over a clip padded to 30 s
    assert [a.feature_length for a in enc.audios] == frames
    assert [a.num_tokens for a in enc.audios] == [-(-f // 10) for f in frames]
    assert all(a.sample_rate == profile.audio.sample_rate and not a.video and a.data is None for a in enc.audios)
    assert [a.source for a in enc.audios] == [str(clips / n) for n in names]
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "audio"},
                                             {"type": "audio"}, {"type": "text", "text": "and "}, {"type": "audio"}]},
                {"role": "assistant", "content": "Heard it."}]
    want = reference_ids(toy, messages, [a.num_tokens for a in enc.audios])
    np.testing.assert_array_equal(enc.input_ids, want)
    for a in enc.audios:
        run = slice(a.offset, a.offset + a.num_tokens)
        assert (enc.input_ids[run] == toy.audio_token_id).all() and (enc.labels[run] == IGNORE_INDEX).all()
    assert int((enc.input_ids == toy.audio_token_id).sum()) == enc.num_audio_tokens == sum(a.num_tokens for a in enc.audios)
    assert enc.num_vision_tokens == 0 and enc.audios[0].seconds == pytest.approx(samples[0] / 16000)


def test_window_inline_bytes_and_tree_branches(toy, clips):
    data = (clips / "tone.mp3").read_bytes()
    ex = record(clips, audio("noise.flac", audio_start=0.25, audio_end=1.5), {"type": "text", "text": "Say?"},
                branches=[[{"role": "assistant", "content": "A hiss."}],
                          [{"role": "assistant", "content": "Listen:"},
                           {"role": "user", "content": [{"type": "audio", "audio": {"bytes": data, "path": "t.mp3"}}]},
                           {"role": "assistant", "content": "A tone."}]])
    enc = toy.encode(ex)
    first, second = enc.audios
    assert (first.audio_start, first.audio_end) == (0.25, 1.5)
    assert first.num_samples == loaded(clips, "noise.flac", 0.25, 1.5) == 20000
    assert second.data == data and second.source == "" and second.num_samples == loaded(clips, "tone.mp3")
    node_of = lambda off: int(np.searchsorted(enc.node_offsets, off, side="right") - 1)  # noqa: E731
    assert [node_of(a.offset) for a in enc.audios] == [0, 2]  # the root's clip, then the second branch's
    for a in enc.audios:
        assert (enc.input_ids[a.offset : a.offset + a.num_tokens] == toy.audio_token_id).all()


def test_truncation_never_cuts_a_clip(qwen_tokenizer, clips):
    ex = record(clips, {"type": "text", "text": "Listen to this:"}, audio("speech.wav"))
    ex.root.messages[0].loss = True  # loss on the question, so a cut before the clip keeps some
    whole = Encoder(qwen_tokenizer, ToyProfile(name="toy"), chat_template=TEMPLATE).encode(ex)
    (clip,) = whole.audios
    inside = clip.offset + clip.num_tokens // 2  # a cut inside the clip's run moves before it
    cut = Encoder(qwen_tokenizer, ToyProfile(name="toy"), chat_template=TEMPLATE, max_length=inside,
                  overlong="truncate").encode(ex)
    assert cut.audios == [] and cut.num_tokens <= clip.offset
    assert int((cut.input_ids == whole.input_ids[clip.offset]).sum()) == 0  # no stray placeholder of the cut clip
    after = clip.offset + clip.num_tokens + 2
    kept = Encoder(qwen_tokenizer, ToyProfile(name="toy"), chat_template=TEMPLATE, max_length=after,
                   overlong="truncate").encode(ex)
    assert kept.audios == [clip] and kept.num_tokens == after


def test_families_without_audio_refuse_it(qwen_tokenizer, clips):
    ex = record(clips, audio("speech.wav"), {"type": "text", "text": "What?"})
    for name in ("text", "qwen2-vl", "llava"):
        with pytest.raises(RecordError, match=f"profile '{name}' takes no audio") as e:
            Encoder(qwen_tokenizer, get_profile(name)).encode(ex)
        assert (e.value.reason, e.value.path, e.value.line) == ("unsupported_medium", "speech.jsonl", 4)


def test_bad_and_missing_clips_are_rejected_where_they_are(toy, clips):
    results = toy.encode_batch([record(clips, audio("broken.wav")), record(clips, audio("speech.wav"))])
    bad, good = results
    assert isinstance(bad, RecordError) and (bad.reason, bad.path, bad.line) == ("bad_audio", "speech.jsonl", 4)
    assert "broken.wav" in bad.message and not isinstance(good, RecordError)
    (clips / "gone.wav").write_bytes(b"x")
    ex = record(clips, audio("gone.wav"))
    (clips / "gone.wav").unlink()
    with pytest.raises(RecordError) as e:
        toy.encode(ex)
    assert e.value.reason == "missing_audio"
    with pytest.raises(RecordError) as e:  # a window past the clip's end
        toy.encode(record(clips, audio("tone.mp3", audio_start=5.0)))
    assert e.value.reason == "bad_audio"


def test_literal_audio_token_in_text_is_refused(toy, clips):
    with pytest.raises(RecordError, match="holds '<|quad_start|>' literally") as e:
        toy.encode(record(clips, audio("speech.wav"), {"type": "text", "text": f"fake {AUDIO}"}))
    assert e.value.reason == "image_count_mismatch"


# ---------------------------------------------------------------- a video's sound track inside its video's run


class _ToyVideo(VideoRule):
    """Every clip two frames, 4 tokens."""

    def plan(self, video: VideoRef) -> VideoPlan:
        return VideoPlan(frame_indices=(0, 1), video_fps=10.0, total_frames=15, sample_fps=2.0, utils_size=(48, 64),
                         size=(48, 64), grid_thw=(1, 2, 2), num_tokens=4, second_per_grid_t=1.0, timestamps=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyAV(ToyProfile):
    """The toy with video (4 tokens per clip) whose sound track it interleaves with the frames, Qwen-Omni style:
    ``<|box_start|>`` video x2, audio x(first half), video x2, audio x(rest) ``<|box_end|>``."""

    video_token: str | None = "<|video_pad|>"
    interleave: bool = True

    @property
    def video(self) -> _ToyVideo:
        return _ToyVideo()

    def media_runs(self, media: list[Media], node_parents: np.ndarray) -> list[MediaRun]:
        out, k = [], 0
        while k < len(media):
            ref = media[k].ref
            track = k + 1 < len(media) and isinstance(media[k + 1].ref, AudioRef) and media[k + 1].ref.video
            if not (isinstance(ref, VideoRef) and track and self.interleave):
                out += super().media_runs(media[k : k + 1], node_parents)
                k += 1
                continue
            plan = self.video.plan(ref)
            audio_run = self.audio.run(self.audio.plan(media[k + 1].ref))
            half = audio_run.num_tokens // 2
            tokens = ("<|box_start|>", *[self.video_token] * 2, *[self.audio_token] * half, *[self.video_token] * 2,
                      *[self.audio_token] * (audio_run.num_tokens - half), "<|box_end|>")
            out.append(MediaRun(plan.grid_thw, plan.num_tokens, tokens=tokens, lead=1, plan=plan))
            out.append(audio_run._replace(inside=True, lead=3))
            k += 2
        return out


def test_a_video_sound_track_lies_inside_its_video_run(qwen_tokenizer, clips):
    enc = Encoder(qwen_tokenizer, ToyAV(name="toy-av"), chat_template=TEMPLATE)
    ex = record(clips, {"type": "video", "video": "movie.mp4", "video_start": 0.2}, audio("tone.mp3"),
                use_audio_in_video=True)
    out = enc.encode(ex)
    track, clip = out.audios
    assert track.video and track.source == str(clips / "movie.mp4") and track.audio_start == 0.2
    want = int(decode_audio(str(clips / "movie.mp4"), target_sr=16000, start=0.2, video=True).shape[0])
    assert track.num_samples == want
    (video,) = out.videos
    ids = out.input_ids
    assert ids[video.offset - 1] == qwen_tokenizer.convert_tokens_to_ids("<|box_start|>")
    assert track.offset == video.offset + 2  # lead 3 into the run
    assert (ids[track.offset : track.offset + track.num_tokens // 2] == enc.audio_token_id).all()
    run_end = video.offset - 1 + 4 + track.num_tokens + 2
    assert ids[run_end - 1] == qwen_tokenizer.convert_tokens_to_ids("<|box_end|>")
    assert (ids[clip.offset : clip.offset + clip.num_tokens] == enc.audio_token_id).all() and not clip.video
    assert int((ids == enc.audio_token_id).sum()) == track.num_tokens + clip.num_tokens
    # the track without a family that interleaves it: refused, not dropped
    plain = Encoder(qwen_tokenizer, ToyAV(name="toy-av", interleave=False), chat_template=TEMPLATE)
    with pytest.raises(RecordError, match="does not take a video's sound track") as e:
        plain.encode(ex)
    assert e.value.reason == "unsupported_medium"
    # and without the option, the same video is a video alone
    assert enc.encode(record(clips, {"type": "video", "video": "movie.mp4"})).audios == []


@pytest.mark.slow
def test_the_spoken_qa_set_encodes_with_its_clips_counted(toy, coco_dir, tmp_path, monkeypatch):
    """scripts/coco_to_jsonl.py --audio: real clips (wav and flac, mono and stereo, 16-44.1 kHz) beside COCO images,
    every record encoded with no reject, every clip counted as it decodes; the same bytes when rerun."""
    import runpy

    from packer.formats.read import read_jsonl

    out = tmp_path / "jsonl"
    script = Path(__file__).resolve().parents[2] / "scripts" / "coco_to_jsonl.py"
    monkeypatch.setattr("sys.argv", ["coco_to_jsonl.py", "--coco", str(coco_dir), "--out", str(out), "--audio", "3"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    first = {p.name: p.read_bytes() for p in (out / "audio").iterdir()}
    assert len(first) == 9 and {p.rsplit(".", 1)[1] for p in first} == {"wav", "flac"}
    rows = list(read_jsonl(str(out / "coco_spoken_qa.jsonl")))
    assert len(rows) == 9 and all(not isinstance(ex, RecordError) for _, ex in rows)
    clips = images = 0
    for _, ex in rows:
        enc = toy.encode(ex)
        for a in enc.audios:
            assert a.num_samples == decode_audio(a.source, target_sr=16000, start=a.audio_start).shape[0]
            assert (enc.input_ids[a.offset : a.offset + a.num_tokens] == toy.audio_token_id).all()
            clips += 1
        images += len(enc.images)
    assert (clips, images) == (9, 3)  # a spoken question beside each image
    with pytest.raises(SystemExit):
        runpy.run_path(str(script), run_name="__main__")
    assert {p.name: p.read_bytes() for p in (out / "audio").iterdir()} == first  # deterministic


def _parts(draw_clips: list[str], texts: list[str]) -> list[dict]:
    out = []
    for clip, text in zip(draw_clips, texts, strict=False):
        out += [{"type": "audio", "audio": clip}, {"type": "text", "text": text}]
    return out or [{"type": "text", "text": "-"}]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_placement_of_clips_in_trees_covers_exactly_the_audio_tokens(toy, clips, data):
    """Clips anywhere (several per message, in the prefix and in nested branches): the stored entries, in token
    order, cover exactly the audio tokens, one run each, every run inside one tree node, each clip's count its
    file's (one header read per file and window: the same clip counts the same everywhere)."""
    names = ["speech.wav", "tone.mp3", "noise.flac"]
    pick = st.lists(st.sampled_from(names), max_size=3)
    words = st.lists(st.sampled_from(["a", " b", "cd ", "\n", "é"]), min_size=3, max_size=3)
    prefix = data.draw(pick)
    branches = [[{"role": "assistant", "content": "x"}, {"role": "user", "content": _parts(data.draw(pick), data.draw(words))},
                 {"role": "assistant", "content": "y"}] for _ in range(data.draw(st.integers(0, 2)))]
    obj = {"messages": [{"role": "user", "content": _parts(prefix, data.draw(words))}],
           **({"branches": branches} if branches else {})}
    if not branches:
        obj["messages"].append({"role": "assistant", "content": "z"})
    ex = parse_record(obj, path="p.jsonl", line=1, base_dir=str(clips))
    enc = toy.encode(ex)
    tokens = np.zeros(enc.num_tokens, dtype=np.int64)
    for a in enc.audios:
        tokens[a.offset : a.offset + a.num_tokens] += 1
        node = np.searchsorted(enc.node_offsets, [a.offset, a.offset + a.num_tokens - 1], side="right")
        assert node[0] == node[1]  # one tree node
    np.testing.assert_array_equal(tokens, (enc.input_ids == toy.audio_token_id).astype(np.int64))
    assert [a.offset for a in enc.audios] == sorted(a.offset for a in enc.audios)
    per_file = {}
    for a in enc.audios:
        assert per_file.setdefault(a.source, a.num_tokens) == a.num_tokens
    assert len(enc.audios) == len(ex.audios)


def _omni_turns(clips: Path, *names: str, branches=None):
    """A chat with one user turn per clip (each asking about it) and an answer after each."""
    msgs = []
    for k, name in enumerate(names):
        msgs += [{"role": "user", "content": [audio(name), {"type": "text", "text": f"What is clip {k + 1}?"}]},
                 {"role": "assistant", "content": f"Clip {k + 1} is a sound."}]
    obj = {"messages": msgs, **({"branches": branches} if branches else {})}
    return parse_record(obj, path="omni.jsonl", line=7, base_dir=str(clips))


@pytest.mark.slow
def test_truncation_keeps_a_clips_padding_or_refuses(clips):
    """Qwen3-Omni pads an example's clips to its longest (padded_samples): a cut that drops the longest clip
    would leave a kept clip with another example's features and count, so it is untruncatable; a cut that keeps
    the longest clip keeps every kept clip exactly as a fresh encode of the kept part stores it."""
    from tests.encode.helpers import builtin

    tok, profile = builtin("qwen3-omni"), get_profile("qwen3-omni")

    def cut_before_clip(ex, k: int) -> Encoder:  # a max_length that ends inside clip k's run
        whole = Encoder(tok, profile).encode(ex)
        a = sorted(whole.audios, key=lambda a: a.offset)[k]
        return Encoder(tok, profile, max_length=a.offset + a.num_tokens // 2, overlong="truncate")

    # the short clip first, the longest second: cutting the second changes the first's padding
    short_first = _omni_turns(clips, "tone.mp3", "noise.flac")
    whole = Encoder(tok, profile).encode(short_first)
    assert [a.padded_samples for a in whole.audios] == [32800, 32800]  # 2.05 s at 16 kHz
    with pytest.raises(RecordError, match=r"untruncatable: cutting to --max-length \d+ drops the audio clip that set "
                                          r"the padding of kept clip 1 \(.*tone\.mp3\): profile 'qwen3-omni' pads an "
                                          r"example's clips to its longest, 32800 samples before the cut, 11200 after"):
        cut_before_clip(short_first, 1).encode(short_first)

    # the longest first: cutting the shorter one leaves the kept clip padded as before
    long_first = _omni_turns(clips, "noise.flac", "tone.mp3")
    cut = cut_before_clip(long_first, 1).encode(long_first)
    (kept,) = cut.audios
    alone = Encoder(tok, profile).encode(_omni_turns(clips, "noise.flac"))
    (fresh,) = alone.audios
    assert kept == fresh and kept.padded_samples == kept.num_samples == 32800
    end = kept.offset + kept.num_tokens
    np.testing.assert_array_equal(cut.input_ids[:end], alone.input_ids[:end])

    # a tree whose two branches both add the longest clip: cutting inside the second branch's clip leaves a path
    # (root, the second branch's start) on which the root's clip is the longest, padded to itself
    tree = _omni_turns(clips, "tone.mp3", branches=[
        [{"role": "user", "content": [audio("noise.flac"), {"type": "text", "text": "And this?"}]},
         {"role": "assistant", "content": "Noise."}],
        [{"role": "user", "content": [audio("noise.flac"), {"type": "text", "text": "Or this?"}]},
         {"role": "assistant", "content": "Hiss."}]])
    assert {a.padded_samples for a in Encoder(tok, profile).encode(tree).audios} == {32800}
    with pytest.raises(RecordError, match=r"untruncatable: .* kept clip 1 .*32800 samples before the cut, "
                                          r"\[11200, 32800\] by path after it"):
        cut_before_clip(tree, 2).encode(tree)
    # cutting inside the first branch's clip keeps the root's only, on its own path: 11200 after, refused too
    with pytest.raises(RecordError, match=r"untruncatable: .*32800 samples before the cut, 11200 after it"):
        cut_before_clip(tree, 1).encode(tree)
