"""Audio parts in every input form: a chat part (Qwen-Omni's, with its window), OpenAI's ``input_audio``, a
top-level ``audios`` pool taken by ``<audio>`` (ms-swift / LLaMA-Factory), ``datasets.Audio`` structs in
Parquet, a video's own sound track (``use_audio_in_video``), clips inside tree branches; and the rejects."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from packer.core.types import AudioRef, VideoRef
from packer.errors import RecordError
from packer.formats import parse_record
from packer.formats.tables import row_records


def wav_bytes(seconds: float = 0.5, rate: int = 22050) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "clip.wav").write_bytes(wav_bytes())
    (tmp_path / "other.flac").write_bytes(b"fLaC")  # parsing checks existence only; the header is read when encoding
    (tmp_path / "movie.mp4").write_bytes(b"x")
    (tmp_path / "f0.jpg").write_bytes(b"x")
    (tmp_path / "dir").mkdir()
    return tmp_path


def parse(obj: dict, root: Path, **kw):
    return parse_record(obj, path="in.jsonl", line=7, base_dir=str(root), **kw)


def parts(example) -> list:
    return [p for node, _ in example.root.walk() for m in node.messages for p in m.parts]


def test_chat_part_with_window(root):
    ex = parse({"messages": [
        {"role": "user", "content": [{"type": "audio", "audio": "clip.wav", "audio_start": 0.1, "audio_end": 0.4},
                                     {"type": "text", "text": "What is said?"},
                                     {"audio": "file://" + str(root / "other.flac")}]},
        {"role": "assistant", "content": "A tone."}]}, root)
    clip, text, other, answer = parts(ex)
    assert clip == AudioRef(path=str(root / "clip.wav"), start=0.1, end=0.4)
    assert other == AudioRef(path=str(root / "other.flac"))
    assert (text, answer) == ("What is said?", "A tone.") and ex.audios == [clip, other]
    assert clip.placeholder and not clip.video


def test_inline_forms(root):
    data = wav_bytes()
    url = "data:audio/wav;base64," + base64.b64encode(data).decode()
    ex = parse({"messages": [
        {"role": "user", "content": [{"type": "audio", "audio": url},
                                     {"type": "audio_url", "audio_url": {"url": url}},
                                     {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(),
                                                                             "format": "wav"}}]},
        {"role": "assistant", "content": "Three."}]}, root)
    assert parts(ex)[:3] == [AudioRef(data=data)] * 3
    assert AudioRef(data=data).source == f"<inline {len(data)} bytes>"


def test_pool_placeholders_in_both_kinds_and_trees(root):
    ex = parse({"messages": [{"role": "user", "content": "<audio> then <audio>?"}],
                "audios": ["clip.wav", {"bytes": None, "path": "other.flac"}],
                "branches": [[{"role": "assistant", "content": "Yes."}],
                             [{"role": "assistant", "content": "No: "},
                              {"role": "user", "content": [{"type": "audio", "audio": "clip.wav"}]},
                              {"role": "assistant", "content": "see."}]]}, root)
    got = parts(ex)
    assert got[:3] == [AudioRef(path=str(root / "clip.wav")), " then ", AudioRef(path=str(root / "other.flac"))]
    assert [len(n.messages) for n, _ in ex.root.walk()] == [1, 1, 3]
    assert len(ex.audios) == 3  # the branch's clip too
    # ShareGPT (ms-swift / LLaMA-Factory): placeholders in the text, or prepended to the first human turn
    sharegpt = {"conversations": [{"from": "human", "value": "<audio>Transcribe."}, {"from": "gpt", "value": "Hi."}],
                "audios": ["clip.wav"]}
    assert parts(parse(sharegpt, root))[0] == AudioRef(path=str(root / "clip.wav"))
    bare = {"conversations": [{"from": "human", "value": "Transcribe."}, {"from": "gpt", "value": "Hi."}],
            "audios": ["clip.wav"]}
    assert parts(parse(bare, root))[:2] == [AudioRef(path=str(root / "clip.wav")), "\nTranscribe."]
    text = {"conversations": [{"from": "human", "value": "an <audio> tag"}, {"from": "gpt", "value": "ok"}]}
    assert parts(parse(text, root))[0] == "an <audio> tag"  # no clips: the tag is text


def test_preference_pairs_take_audio(root):
    ex = parse({"prompt": [{"role": "user", "content": "<audio>Say it."}], "audios": ["clip.wav"],
                "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]},
               root)
    assert ex.audios == [AudioRef(path=str(root / "clip.wav"))]


def test_video_sound_track(root):
    record = {"messages": [
        {"role": "user", "content": [{"type": "video", "video": "movie.mp4", "video_start": 1.0, "video_end": 2.5},
                                     {"type": "text", "text": "What do you hear?"}]},
        {"role": "assistant", "content": "Rain."}]}
    assert not parse(record, root).audios  # off by default
    video, track, text, _ = parts(parse(record, root, audio_in_video=True))
    assert isinstance(video, VideoRef) and text == "What do you hear?"
    assert track == AudioRef(path=str(root / "movie.mp4"), start=1.0, end=2.5, video=True) and not track.placeholder
    assert parse({**record, "use_audio_in_video": True}, root).audios == [track]  # the record's option
    assert not parse({**record, "use_audio_in_video": False}, root, audio_in_video=True).audios  # wins over the build
    frames = {"messages": [{"role": "user", "content": [{"type": "video", "video": ["f0.jpg"]}]},
                           {"role": "assistant", "content": "x"}], "use_audio_in_video": True}
    with pytest.raises(RecordError, match="no sound track") as e:
        parse(frames, root)
    assert e.value.reason == "bad_audio"


def test_parquet_datasets_audio_column(root, tmp_path):
    """``datasets.Audio`` stores a clip as a {bytes, path} struct: the bytes are what a build reads."""
    data = wav_bytes(0.25, 16000)
    table = pa.table({
        "messages": [[{"role": "user", "content": "<audio>Transcribe."}, {"role": "assistant", "content": "ok"}]] * 2,
        "audios": [[{"bytes": data, "path": "a.wav"}], [{"bytes": None, "path": str(root / "clip.wav")}]],
    })
    path = tmp_path / "speech.parquet"
    pq.write_table(table, path)
    rows = list(row_records(str(path), 0, 2))
    first, second = (parse_record(r, path=str(path), line=i + 1, base_dir=str(tmp_path)) for i, r in enumerate(rows))
    assert first.audios == [AudioRef(data=data)]
    assert second.audios == [AudioRef(path=str(root / "clip.wav"))]


@pytest.mark.parametrize(("part", "reason", "words"), [
    ({"type": "audio", "audio": "gone.wav"}, "missing_audio", "gone.wav does not exist"),
    ({"type": "audio", "audio": "http://x/a.wav"}, "missing_audio", "is a URL"),
    ({"type": "audio", "audio": "dir"}, "bad_audio", "is a directory"),
    ({"type": "audio", "audio": b""}, "bad_audio", "empty"),
    ({"type": "audio", "audio": "data:audio/wav,abc"}, "bad_audio", "not a base64 data URL"),
    ({"type": "audio", "audio": "data:audio/wav;base64,@@"}, "bad_audio", "not valid base64"),
    ({"type": "audio", "audio": 5}, "wrong_type", "an audio source must be"),
    ({"type": "audio", "audio": "clip.wav", "audio_start": "1"}, "wrong_type", "must be a number of seconds"),
    ({"type": "audio", "audio": "clip.wav", "audio_start": -1}, "bad_audio", "negative"),
    ({"type": "audio", "audio": "clip.wav", "audio_start": 2, "audio_end": 1}, "bad_audio", "not after audio_start"),
    ({"type": "input_audio", "input_audio": "x"}, "wrong_type", "input_audio"),
    ({"type": "audio"}, "image_count_mismatch", "more audio placeholders than audio clips"),
    ({"type": "sound", "sound": "clip.wav"}, "wrong_type", "image_url, video or audio"),
])
def test_rejects_say_where_and_why(root, part, reason, words):
    with pytest.raises(RecordError) as e:
        parse({"messages": [{"role": "user", "content": [part]}, {"role": "assistant", "content": "x"}]}, root)
    assert (e.value.reason, e.value.path, e.value.line) == (reason, "in.jsonl", 7)
    assert words in e.value.message


def test_pool_counts_must_match(root):
    with pytest.raises(RecordError, match="lists 2 audio clips but its messages have 1") as e:
        parse({"messages": [{"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "x"}],
               "audios": ["clip.wav", "clip.wav"]}, root)
    assert e.value.reason == "image_count_mismatch"
    with pytest.raises(RecordError, match="'use_audio_in_video' must be true or false"):
        parse({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
               "use_audio_in_video": 1}, root)
