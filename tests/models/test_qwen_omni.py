"""Qwen2.5-Omni (thinker) against transformers 5.23.0's own code: the builtin tokenizer against
``Qwen2_5OmniThinkerConfig``'s ids and what ``Qwen2_5OmniProcessor`` reads off it; audio token counts against the
processor on clips of every length (below one frame, one frame, odd lengths, past 30 s); the interleaved layout
of a video with its sound against the processor's ``replace_video_with_audio_token``; positions against the
model's ``get_rope_index`` on random sequences of text, images, audio, videos and videos with sound, and on every
root-to-leaf path of trees.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    Qwen2_5OmniProcessor,
    Qwen2_5OmniThinkerConfig,
)
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniPreTrainedModelForConditionalGeneration as OmniModel,
)

from packer.encode.tokenizers import load_tokenizer
from packer.models.qwen_omni.rope import (
    audio_tokens_from_frames,
    interleave,
    mel_frames,
    omni_position_ids,
)
from tests.helpers import (
    SOUND_TRACK_FAULTS,
    assert_verify_finds,
    break_sound_track,
    check_omni_tree,
    encode_records,
    omni_processor_out,
    qwen2vl_video_processor,
    random_omni_sequence,
    record_paths,
    tiny_model_report,
    token_paths,
    without_video_processor,
    write_omni_media,
)
from tests.models import released

IMG, VID, AUD, VB, VE, AB, AE = 151655, 151656, 151646, 151652, 151653, 151647, 151648


TOKENS = dict(image=IMG, video=VID, audio=AUD, vision_start=VB, vision_end=VE, audio_start=AB, audio_end=AE)
_Processor = without_video_processor(Qwen2_5OmniProcessor)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2.5-omni")


@pytest.fixture(scope="module")
def processor(tok):
    # Qwen/Qwen2.5-Omni-7B preprocessor_config.json (tests/models/released/qwen_omni.json): WhisperFeatureExtractor
    # with 128 mel bins and chunk_length 300, Qwen2VL images
    return _Processor(image_processor=released.image_processor("qwen2.5-omni"), video_processor=None,
                      feature_extractor=released.whisper_extractor(released.load("qwen_omni")["profiles"]["qwen2.5-omni"]),
                      tokenizer=tok, chat_template=tok.chat_template)


@pytest.fixture(scope="module")
def rope_model():
    """The thinker's get_rope_index bound to a released thinker config (vision_start_token_id is a checkpoint
    key the config class does not define)."""
    config = Qwen2_5OmniThinkerConfig()
    config.vision_start_token_id = VB
    ns = types.SimpleNamespace(config=config, spatial_merge_size=2)
    ns.get_llm_pos_ids_for_vision = lambda *a: OmniModel.get_llm_pos_ids_for_vision(ns, *a)
    ns.get_chunked_index = lambda *a: OmniModel.get_chunked_index(ns, *a)
    return lambda *a: OmniModel.get_rope_index(ns, *a)


# ------------------------------------------------------------------ the tokenizer


def test_tokenizer_ids(tok, processor) -> None:
    config = Qwen2_5OmniThinkerConfig()
    assert tok("Hello world!").input_ids == [9707, 1879, 0]  # Qwen2's BPE
    assert tok.convert_tokens_to_ids(["<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>"]) == [
        config.audio_token_id, config.image_token_id, config.video_token_id, config.audio_start_token_id,
        config.audio_end_token_id]
    assert tok.convert_tokens_to_ids(["<|vision_bos|>", "<|vision_eos|>", "<|im_end|>", "<tool_call>"]) == [
        151652, 151653, 151645, 151657]
    assert len(tok) == 151665
    assert (processor.audio_token_id, processor.image_token_id, processor.video_token_id) == (AUD, IMG, VID)
    assert (processor.audio_bos_token, processor.vision_eos_token) == ("<|audio_bos|>", "<|vision_eos|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_template_renders_each_medium(processor) -> None:
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "image", "image": "i.png"},
                                         {"type": "video", "video": "v.mp4"}, {"type": "text", "text": "what?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]
    text = processor.apply_chat_template(msgs, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|audio_bos|><|AUDIO|><|audio_eos|><|vision_bos|><|IMAGE|><|vision_eos|><|vision_bos|><|VIDEO|><|vision_eos|>"
        "what?<|im_end|>\n<|im_start|>assistant\na dog<|im_end|>\n"
    )


# ------------------------------------------------------------------ audio counts


SAMPLE_COUNTS = [1, 159, 160, 161, 320, 321, 480, 481, 799, 800, 1600, 15999, 16000, 16001, 16161, 40000, 123457,
                 479840, 479999, 480000, 480001, 560000]


@pytest.mark.slow
def test_audio_tokens_equal_the_processor(processor) -> None:
    msgs = [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    rng = np.random.default_rng(0)
    for n in SAMPLE_COUNTS:
        out = processor(text=text, audio=[rng.standard_normal(n).astype(np.float32)], return_tensors="np")
        frames = int(out["feature_attention_mask"].sum())
        assert mel_frames(n) == frames, n
        want = int((out["input_ids"][0] == AUD).sum())
        assert audio_tokens_from_frames(frames) == want == processor._get_num_audio_tokens(n), n
    assert audio_tokens_from_frames(mel_frames(320)) == 0  # < 20 ms: no token at all (the model cannot take it)
    assert audio_tokens_from_frames(mel_frames(480000)) == 750  # 30 s: no cap there (the released chunk is 300 s)
    assert audio_tokens_from_frames(mel_frames(4800000)) == audio_tokens_from_frames(mel_frames(10**7)) == 7500


# ------------------------------------------------------------------ a video with its sound


@pytest.mark.parametrize(("grid", "spg", "n"), [
    ((1, 4, 4), 1.0, 3), ((3, 4, 6), 1.0, 60), ((10, 2, 2), 1.0, 250), ((5, 4, 4), 2.0, 40), ((7, 2, 4), 0.5, 7),
    ((6, 2, 2), 2 / 3, 100), ((4, 6, 2), 1.3, 130), ((2, 2, 2), 1.0, 1), ((9, 2, 2), 0.6667, 500),
])
def test_interleave_equals_the_processor(processor, grid, spg, n) -> None:
    video_inputs = {"video_grid_thw": np.array([grid]), "video_second_per_grid": [spg]}
    processor.video_processor = types.SimpleNamespace(merge_size=2)  # the one attribute the method reads
    try:
        text = processor.replace_video_with_audio_token(
            video_inputs, 0, {"num_audio_tokens": np.array([n])}, 0, position_id_per_seconds=25, seconds_per_chunk=2.0)
    finally:
        processor.video_processor = None
    want = processor.tokenizer(text).input_ids
    lay = interleave(grid, spg, n)
    assert [AB, *np.where(lay.kinds == 0, VID, AUD).tolist(), AE] == want


# ------------------------------------------------------------------ positions


def _frames_for(n: int) -> int:
    return next(L for L in range(1, 3001) if audio_tokens_from_frames(L) == n)


def _random_sequence(rng, with_sound: bool):
    return random_omni_sequence(
        rng, with_sound, tokens=TOKENS, frames_for=_frames_for, seconds_per_grid=(0.5, 1.0, 2.0, 0.6667, 1.3),
        av_kinds=lambda g, sp, n: interleave(g, sp, n).kinds)


def _reference(rope_model, ids, igr, vgr, spg, aud, with_sound) -> np.ndarray:
    x = torch.tensor([ids])
    t = lambda v: torch.tensor(v) if v else None  # noqa: E731
    pos, _ = rope_model(x, t(igr), t(vgr), torch.ones_like(x), with_sound, t(aud), t(spg))
    return pos[:, 0].numpy()


@pytest.mark.parametrize("with_sound", [False, True])
def test_positions_equal_get_rope_index(rope_model, with_sound) -> None:
    rng = np.random.default_rng(1 + with_sound)
    checked = 0
    for _ in range(120):
        ids, blocks, igr, vgr, spg, aud = _random_sequence(rng, with_sound)
        if not igr and not vgr:
            continue  # get_rope_index's 1-D branch (text and audio alone): 0..L-1, which ours gives too
        got = omni_position_ids(np.array(ids), np.array([0]), np.array([-1]), blocks)
        np.testing.assert_array_equal(got, _reference(rope_model, ids, igr, vgr, spg, aud, with_sound))
        checked += 1
    assert checked > 80


@pytest.mark.parametrize("with_sound", [False, True])
def test_positions_on_trees(rope_model, with_sound) -> None:
    """A root and two branches, each a random sequence: every root-to-leaf path equals get_rope_index on it alone."""
    rng = np.random.default_rng(7 + with_sound)
    for _ in range(30):
        check_omni_tree(rng, with_sound, _random_sequence,
                        lambda ids, offsets, parents, blocks: omni_position_ids(np.array(ids), offsets, parents, blocks),
                        lambda *path: _reference(rope_model, *path, with_sound))


# ------------------------------------------------------------------ every path's ids through the encoder


@pytest.fixture(scope="module")
def av_processor(tok):
    class WithVideo(Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":
                return type(argument)
            return super().check_argument_for_proper_class(argument_name, argument)

    video, mp = qwen2vl_video_processor(cap_pixels_per_frame=False)
    yield WithVideo(image_processor=released.image_processor("qwen2.5-omni"),
                    video_processor=video, feature_extractor=released.audio_extractor("qwen2.5-omni"), tokenizer=tok,
                    chat_template=tok.chat_template)
    mp.undo()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return write_omni_media(tmp_path_factory.mktemp("omni"))


def _omni_records() -> list[dict]:
    audio = lambda name, **w: {"type": "audio", "audio": name, **w}  # noqa: E731
    image = lambda name: {"type": "image", "image": name}  # noqa: E731
    video = lambda name: {"type": "video", "video": name}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return [
        {"messages": [{"role": "user", "content": [audio("speech.wav"), image("pic.png"), text("What is heard?")]},
                      {"role": "assistant", "content": "Speech."}]},
        {"messages": [{"role": "user", "content": [video("movie.mp4"), audio("tone.mp3"), text("Same?")]},
                      {"role": "assistant", "content": "No."}], "use_audio_in_video": True},
        {"messages": [{"role": "user", "content": [audio("noise.flac", audio_start=0.3, audio_end=1.7),
                                                   image("tall.png"), text("Describe.")]}],
         "branches": [[{"role": "assistant", "content": "A hiss."}],
                      [{"role": "assistant", "content": "Watch:"},
                       {"role": "user", "content": [video("long.mp4"), text("And this?")]},
                       {"role": "assistant", "content": "A long one."}]],
         "use_audio_in_video": True},
        {"messages": [{"role": "user", "content": [{**video("long.mp4"), "fps": 1.0}, audio("short.m4a"),
                                                   text("Both?")]},
                      {"role": "assistant", "content": "Yes."}]},
        # audio alone: get_rope_index's 1-D branch
        {"messages": [{"role": "user", "content": [text("Listen: "), audio("tone.mp3")]},
                      {"role": "assistant", "content": "A tone."}]},
    ]


@pytest.mark.slow
def test_every_path_equals_the_processor(tok, av_processor, media, rope_model) -> None:
    """Each record's every root-to-leaf path: the encoder's ids equal ``Qwen2_5OmniProcessor(text=
    apply_chat_template(path), audio=the loader's clips, images=..., videos=the sampled frames)["input_ids"]``
    (with ``load_audio_from_video`` and one audio per slot where the record uses a video's sound), and its
    positions equal the thinker's ``get_rope_index`` on those ids."""

    from packer.encode.encoder import Encoder
    from packer.formats import parse_record
    from packer.models import get_profile

    encoder = Encoder(tok, get_profile("qwen2.5-omni"))
    checked = 0
    for record in _omni_records():
        enc = encoder.encode(parse_record(record, path="omni.jsonl", line=1, base_dir=str(media)))
        with_sound = bool(record.get("use_audio_in_video"))
        for msgs, cols in zip(record_paths(record), token_paths(enc), strict=True):
            out, audio, video_entries = omni_processor_out(av_processor, msgs, enc, cols, media, with_sound=with_sound)
            np.testing.assert_array_equal(enc.input_ids[cols], out["input_ids"][0].numpy())
            if video_entries:
                assert out["video_grid_thw"].tolist() == [list(v.grid_thw) for v in video_entries]
                assert out["video_second_per_grid"].tolist() == [v.second_per_grid_t for v in video_entries]
            if audio:
                frames = out["feature_attention_mask"].sum(-1).tolist()
                mine = [a for a in enc.audios if a.offset in set(cols.tolist())]
                assert sorted(frames) == sorted(a.feature_length for a in mine)
            # (audio alone: the 1-D branch, 0..L-1 from the attention mask)
            ref, _ = rope_model(out["input_ids"], out.get("image_grid_thw"), out.get("video_grid_thw"),
                                torch.ones_like(out["input_ids"]), with_sound and bool(video_entries),
                                out["feature_attention_mask"].sum(-1) if audio else None,
                                out["video_second_per_grid"] if video_entries else None)
            np.testing.assert_array_equal(enc.mrope_position_ids[:, cols], ref[:, 0].numpy())
            checked += 1
    assert checked == 6


# ------------------------------------------------------------------ the reader and packed == unpacked


def _rows_with_audio(tmp_path, examples, pack_sizes):
    """The rows of a shard set of ``examples`` (schema v4: each row's clips in its ``audios`` column)."""
    from packer.train.dataset import PackedDataset
    from tests.helpers import write_shardset

    root = write_shardset(tmp_path / "shards", examples, pack_sizes, profile="qwen2.5-omni")
    rows = list(PackedDataset(root, shuffle=False))
    assert [len(r["audios"]) for r in rows] == [sum(len(e.audios) for e in examples[a:a + n])
                                                for a, n in zip(np.cumsum([0, *pack_sizes[:-1]]), pack_sizes,
                                                                strict=True)]
    return rows


@pytest.fixture(scope="module")
def omni_encoded(tok, media):
    from packer.models import get_profile

    return encode_records(tok, get_profile("qwen2.5-omni"), _omni_records(), media, path="omni.jsonl")


@pytest.mark.slow
def test_reader_audio_equals_the_processor(tmp_path, omni_encoded, processor) -> None:
    """The reader's ``input_features`` / ``feature_attention_mask`` for every clip of the rows (sound tracks too)
    against the processor's on the loader's samples: masks equal, features within float32 rounding."""
    from packer.media.audio import decode_audio
    from packer.train.collate import collate

    rows = _rows_with_audio(tmp_path, omni_encoded, [2, 3])
    batch = collate(rows)
    clips = [a for r in rows for a in r["audios"]]
    assert batch["input_features"].shape == (len(clips), 128, 30000)
    samples = [decode_audio(a["source"], target_sr=16000, start=a["audio_start"], end=a["audio_end"],
                            video=a["video"]) for a in clips]
    want = processor.feature_extractor(samples, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                                       return_tensors="pt")
    assert torch.equal(batch["feature_attention_mask"], want["attention_mask"].to(torch.int32))
    # the extractor runs its float32 torch STFT here; whisper_log_mel computes in float64 (measured 5.0e-5;
    # tests/media/test_audio.py bounds the two at 1e-4)
    torch.testing.assert_close(batch["input_features"], want["input_features"], rtol=0, atol=1e-4)
    ids = batch["input_ids"][0]
    for off, a in zip(batch["audio_offsets"].tolist(), clips, strict=True):
        assert int(ids[off]) == AUD and a["num_tokens"] == audio_tokens_from_frames(a["feature_length"])
    # a clip stored inline (a datasets.Audio cell's bytes) reads as its file does
    from packer.models import get_profile

    reader = get_profile("qwen2.5-omni").reader()
    first = clips[0]
    inline = {**first, "source": "", "data": open(first["source"], "rb").read()}  # noqa: SIM115
    got = reader.audio_inputs([inline])
    assert torch.equal(got["input_features"][0], batch["input_features"][0])
    # and a clip that no longer decodes to the build's count is refused
    from packer.errors import ShardError

    with pytest.raises(ShardError, match="the build counted"):
        reader.audio_inputs([{**first, "num_samples": first["num_samples"] + 1}])


@pytest.mark.slow
def test_packed_equals_unpacked_with_audio(tmp_path, omni_encoded, tok) -> None:
    """Rows mixing audio clips, images, videos with and without their sound, text and a tree, packed two
    examples a row and collated into one batch: per-token losses, the total and every gradient of a tiny
    Qwen2_5OmniThinkerForConditionalGeneration equal each root-to-leaf path run alone through the model's own
    processing (its get_rope_index, its audio tower on that path's clips alone)."""
    from packer.models import get_profile
    from packer.train.collate import collate

    profile = get_profile("qwen2.5-omni")
    rows = _rows_with_audio(tmp_path, omni_encoded, [2, 3])
    with released.released_reader(profile):  # the released image processor and extractor, not the profile's
        batch = collate(rows)
    _, model = tiny_model_report(profile, tok, batch, paths=6)
    audio_params = [n for n, p in model.named_parameters() if "audio_tower" in n and p.grad is not None]
    assert audio_params, "the audio tower took part"


@pytest.mark.parametrize("fps", [1.3, 2.6, 3.7])
def test_video_with_sound_refused_where_processor_and_model_chunk_apart(processor, rope_model, fps) -> None:
    """At these frame rates (second_per_grid 2 / fps) the processor's float64 time chunks and the model's float32
    ones put some frames in different chunks: the model would give the processor's tokens the wrong positions
    (video positions on audio tokens). packer refuses such a video rather than pack it wrong."""
    from packer.errors import RecordError
    from packer.models.qwen_omni.rope import temporal_index

    grid, spg = (40, 2, 2), 2 / fps
    per = grid[1] * grid[2] // 4
    proc = processor.get_chunked_index(np.repeat(np.arange(grid[0]) * spg * 25, per), 50)
    model = OmniModel.get_chunked_index(None, torch.from_numpy(np.repeat(temporal_index(grid[0], spg), per)), 50, 0)
    assert proc != model
    with pytest.raises(RecordError, match="different time chunks"):
        interleave(grid, spg, 10)


def test_a_clip_without_a_token_is_refused(tok, tmp_path) -> None:
    """Under 321 samples at 16 kHz the processor gives no <|AUDIO|> and get_rope_index fails on the empty clip:
    a bad_audio reject, naming the clip. 321 samples make one token."""
    from packer.encode.encoder import Encoder
    from packer.errors import RecordError
    from packer.formats import parse_record
    from packer.models import get_profile
    from tests.media.audio_clips import signal, write_clip

    write_clip(tmp_path / "blip.wav", signal("tone", 16000, 320 / 16000), 16000)
    write_clip(tmp_path / "one.wav", signal("tone", 16000, 321 / 16000), 16000)
    encoder = Encoder(tok, get_profile("qwen2.5-omni"))

    def encode(name):
        record = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": name}]},
                               {"role": "assistant", "content": "A blip."}]}
        return encoder.encode(parse_record(record, path="a.jsonl", line=3, base_dir=str(tmp_path)))

    with pytest.raises(RecordError, match="blip.wav.*no audio token") as err:
        encode("blip.wav")
    assert err.value.reason == "bad_audio"
    assert [a.num_tokens for a in encode("one.wav").audios] == [1]


# ------------------------------------------------------------------ build, verify, check_equivalence


@pytest.fixture(scope="module")
def omni_build(media, tmp_path_factory):
    import json

    from packer.config import BuildConfig
    from packer.pipeline.build import build

    root = tmp_path_factory.mktemp("omni-build")
    data = media / "data.jsonl"  # paths resolve against the input file's directory
    data.write_text("".join(json.dumps(r) + "\n" for r in _omni_records()))
    config = BuildConfig.from_inputs([str(data)], str(root / "out"), profile="qwen2.5-omni", max_length=4096)
    result = build(config, progress=False)
    return {"root": root, "data": data, "result": result}


@pytest.mark.slow
def test_build_verifies(omni_build) -> None:
    """Every record packed (audio in four codecs, images, videos with and without sound, a tree); verify finds
    each video with sound as the runs of its frames and its sound, in the processor's order, and the positions."""
    from packer.report.verify import verify_build

    totals = omni_build["result"].manifest["totals"]
    assert totals["rejected"] == 0 and totals["examples"] == 5
    report = verify_build(omni_build["root"] / "out", inputs=[str(omni_build["data"])])
    assert report.ok, report.lines()


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(SOUND_TRACK_FAULTS))
def test_verify_finds_each_fault(omni_build, tmp_path, fault) -> None:
    assert_verify_finds(omni_build["root"] / "out", tmp_path,
                        lambda rows: break_sound_track(rows[0], fault, audio_id=AUD, position_step=1),
                        SOUND_TRACK_FAULTS[fault])


@pytest.mark.slow
def test_check_equivalence_runs_audio(omni_build) -> None:
    """``scripts/check_equivalence.py --model qwen2.5-omni`` on the records above: builds, reads the audio, and
    proves packed == unpacked on the real thinker."""
    import contextlib
    import io
    import json

    from scripts import check_equivalence as ce

    data = omni_build["data"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = ce.main(["--data", str(data), "--model", "qwen2.5-omni", "--max-length", "4096",
                      "--backend", "sdpa", "--backend", "sdpa_varlen", "--max-pixels", str(12845056)])
    summary = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert rc == 0 and summary["ok"] and summary["rows"] >= 1, summary


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(0, 130), max_size=60), tokens_per_chunk=st.sampled_from([1, 7, 50]))
def test_chunked_index_equals_the_models(steps, tokens_per_chunk) -> None:
    """Any nondecreasing sequence (values that jump several chunks at once included): ``rope.chunked_index``
    (which skips over the values below the next boundary) cuts it where the model's token-by-token loop does."""
    from packer.models.qwen_omni.rope import chunked_index

    values = np.cumsum(steps).astype(np.int64)
    want = OmniModel.get_chunked_index(None, torch.from_numpy(values), tokens_per_chunk, 0)
    assert chunked_index(values, tokens_per_chunk) == [(int(a), int(b)) for a, b in want]
