"""Audio end to end on real clips: a build with the toy family's audio rule (tests/models/toy_family/) packs
chat parts, ``<audio>`` pools, windows, inline bytes from Parquet and clips in tree branches into schema-v5 shards;
``packer verify`` passes it and names each broken audio invariant; ``packer stats`` and the picture show audio
seconds and tokens per pack; the audio budgets hold and reject what can never fit."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import packer.models.registry
from packer.config import BuildConfig
from packer.media.audio import decode_audio
from packer.models import register_family
from packer.models.shared.audio_features import feature_frames
from packer.pipeline.build import build
from packer.report.plots import plot_stats
from packer.report.stats import format_stats
from packer.report.verify import verify_build
from packer.shards.io import open_shards, read_shard
from packer.shards.schema import SCHEMA_VERSION
from tests.media.audio_clips import signal, write_clip
from tests.models import toy_family
from tests.report.test_verify import _manifest, _mutate, _rewrite

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_pad|>{% elif part['type'] == 'audio' %}<|quad_start|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CLIPS = {"a.wav": (22050, 1.3, 2), "b.mp3": (44100, 0.8, 1), "c.flac": (16000, 2.4, 1), "d.m4a": (48000, 0.6, 2)}
U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731


def _records() -> list[dict]:
    audio = lambda n, **w: {"type": "audio", "audio": f"clips/{n}", **w}  # noqa: E731
    recs = []
    for i in range(6):
        recs.append({"messages": [U([audio("a.wav"), {"type": "text", "text": f"Transcribe {i}."}]), A("Words.")]})
        recs.append({"messages": [U("<audio> and <audio>: same?"), A("No.")], "audios": ["clips/b.mp3", "clips/c.flac"]})
        recs.append({"messages": [U([audio("c.flac", audio_start=0.5, audio_end=1.75), {"type": "text", "text": "Hm?"}])],
                     "branches": [[A("A hiss.")], [A("Noise."), U([audio("d.m4a")]), A("Speech.")]]})
        recs.append({"conversations": [{"from": "human", "value": "<audio>\nWhat is said?"},
                                       {"from": "gpt", "value": f"Reply {i}."}], "audios": ["clips/d.m4a"]})
        recs.append({"messages": [U(f"No audio {i}."), A("Fine.")]})
    return recs


@pytest.fixture(scope="module")
def toy():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packer.models.registry, "_PROFILES", dict(packer.models.registry._PROFILES))
        register_family(toy_family)
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy) -> Path:
    root = tmp_path_factory.mktemp("audio-build")
    (root / "clips").mkdir()
    for name, (rate, seconds, channels) in CLIPS.items():
        write_clip(root / "clips" / name, signal("speech", rate, seconds, channels=channels), rate)
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    data = (root / "clips" / "b.mp3").read_bytes()  # datasets.Audio's storage: a {bytes, path} struct
    pq.write_table(pa.table({"messages": [[U("<audio>Say?"), A("Hi.")]] * 3,
                             "audios": [[{"bytes": data, "path": "b.mp3"}]] * 3}), root / "bytes.parquet")
    (root / "toy.jinja").write_text(TEMPLATE)
    return root


def _config(root: Path, out: str, **kw) -> BuildConfig:
    return BuildConfig.from_inputs([str(root / "data.jsonl"), str(root / "bytes.parquet")], str(root / out),
                                   profile="toy", chat_template=str(root / "toy.jinja"), max_length=160,
                                   rows_per_shard=4, rows_per_row_group=2, **kw)


@pytest.fixture(scope="module")
def built(corpus) -> Path:
    build(_config(corpus, "out", max_audio_tokens=60), progress=False)
    return corpus / "out"


@pytest.fixture
def copy(built, tmp_path) -> Path:
    shutil.copytree(built, tmp_path / "out")
    return tmp_path / "out"


def _rows(out: Path) -> list[dict]:
    shards = open_shards(out)
    return [r for i in range(len(shards.shards)) for r in shards.parquet(i).read().to_pylist()]


@pytest.mark.slow
def test_the_build_stores_every_clip_as_counted(built, corpus):
    rows = _rows(built)
    manifest = _manifest(built)
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["audio_token_id"] == 151650  # <|quad_start|>
    loaded = {name: decode_audio(str(corpus / "clips" / name), target_sr=16000).shape[0] for name in CLIPS}
    window = decode_audio(str(corpus / "clips" / "c.flac"), target_sr=16000, start=0.5, end=1.75).shape[0]
    seen = 0
    for row in rows:
        ids = np.array(row["input_ids"])
        for a in row["audios"]:
            name = Path(a["source"]).name if a["source"] else "b.mp3"
            want = window if a["audio_start"] == 0.5 else loaded[name]
            assert (a["num_samples"], a["sample_rate"]) == (want, 16000)
            assert a["feature_length"] == -(-want // 160) and a["num_tokens"] == -(-a["feature_length"] // 10)
            assert (ids[a["offset"] : a["offset"] + a["num_tokens"]] == 151650).all() and not a["video"]
            assert (a["data"] is None) == bool(a["source"])
            assert a["padded_samples"] is None  # the toy's features are each clip's alone
            seen += 1
        assert row["num_audio_tokens"] == sum(a["num_tokens"] for a in row["audios"]) <= 60
        assert int((ids == 151650).sum()) == row["num_audio_tokens"]
        assert row["seq_lengths"] is None or not row["audios"]
    # 6 x (1 + 2 + 2 in the tree + 1) clips, and the Parquet file's 3 (a tree's shared clip is stored once)
    assert seen == 6 * 6 + 3
    assert verify_build(built).ok, verify_build(built).violations[:3]


@pytest.mark.slow
def test_stats_and_the_picture_show_audio(built, tmp_path):
    stats = json.loads((built / "stats.json").read_text())
    rows = _rows(built)
    assert stats["audio_clips"] == sum(len(r["audios"]) for r in rows)
    assert stats["audio_tokens"] == sum(r["num_audio_tokens"] for r in rows)
    seconds = sum(a["num_samples"] / a["sample_rate"] for r in rows for a in r["audios"])
    assert stats["audio_seconds"] == pytest.approx(seconds)
    assert stats["audio_tokens_per_pack"]["max"] == max(r["num_audio_tokens"] for r in rows) <= 60
    assert sum(stats["hist_audio_per_pack"]["counts"]) == stats["packs"]
    table = format_stats(stats)
    assert "audio tokens / pack" in table and f"{stats['audio_clips']} clips" in table
    assert plot_stats(built, tmp_path / "stats.png").stat().st_size > 10_000


MUTATIONS = {
    "offset": (lambda a: a.__setitem__("offset", a["offset"] + 1), "audio spans and audio tokens"),
    "num_tokens": (lambda a: a.__setitem__("num_tokens", a["num_tokens"] + 1), "does not match its feature_length"),
    "feature_length": (lambda a: a.__setitem__("feature_length", a["feature_length"] - 1), "sample rate, samples or feature length disagree"),
    "num_samples": (lambda a: a.__setitem__("num_samples", a["num_samples"] + 400), "sample rate, samples or feature length disagree"),
    "sample_rate": (lambda a: a.__setitem__("sample_rate", 24000), "sample rate, samples or feature length disagree"),
    # the toy's rule takes no padded_samples (its features are each clip's alone): a clip that has some is wrong
    "padded_samples": (lambda a: a.__setitem__("padded_samples", a["num_samples"] + 16000), "or its padded_samples"),
}


@dataclasses.dataclass(frozen=True)
class _PaddedToyAudio(toy_family.profile.ToyAudio):
    """The toy's audio with Qwen3-Omni's rule: a clip padded (to its example's longest) has min(ceil(n / 160),
    L // 160) frames, the extractor's mask under padding=True, truncation=False."""

    def feature_lengths(self, num_samples: np.ndarray, padded_samples: np.ndarray) -> np.ndarray:
        alone = super().feature_lengths(num_samples, np.full(len(num_samples), -1))
        padded = [feature_frames(int(n), padding="max_length", max_length=int(p), truncation=False) if p >= 0 else -1
                  for n, p in zip(num_samples, padded_samples, strict=True)]
        return np.where(np.asarray(padded_samples) >= 0, np.array(padded, dtype=np.int64), alone)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _PaddedToy(toy_family.profile.ToyProfile):
    """The toy with ``_PaddedToyAudio``."""

    @property
    def audio(self) -> _PaddedToyAudio:
        return _PaddedToyAudio(frames_per_token=self.frames_per_token)


def _pad_every_clip(out: Path, padded) -> None:
    """Set every stored clip's padded_samples to ``padded(clip)``, shard by shard."""
    for s, entry in enumerate(_manifest(out)["shards"]):
        rows = read_shard(out / entry["file"]).to_pylist()
        for r in rows:
            for a in r["audios"]:
                a["padded_samples"] = padded(a)
        _rewrite(out, s, rows)


@pytest.mark.slow
def test_padded_samples_are_checked_by_the_familys_rule(copy, monkeypatch):
    """verify asks a family's audio_feature_lengths with padded_samples where the shards hold them: padded by a
    longer neighbour each clip keeps its ceil(n / 160) frames; padded to itself (alone, or the longest) a clip of
    n samples, n not a multiple of 160, has n // 160, not the stored count; fewer than its samples is wrong."""
    monkeypatch.setitem(packer.models.registry._PROFILES, "toy", _PaddedToy(name="toy"))
    _pad_every_clip(copy, lambda a: a["num_samples"] + 16000)
    report = verify_build(copy)
    assert report.ok, report.violations[:4]
    _pad_every_clip(copy, lambda a: a["num_samples"])
    uneven = sum(a["num_samples"] % 160 != 0 for r in _rows(copy) for a in r["audios"])
    flagged = [v for v in verify_build(copy).violations if "or its padded_samples" in v.what]
    assert uneven and flagged
    _pad_every_clip(copy, lambda a: None)
    assert verify_build(copy).ok
    _mutate(copy, lambda r: bool(r["audios"]),
            lambda r: r["audios"][0].__setitem__("padded_samples", r["audios"][0]["num_samples"] - 160))
    assert any("or its padded_samples" in v.what for v in verify_build(copy).violations)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_audio_invariant_is_reported(copy, name):
    change, text = MUTATIONS[name]
    _mutate(copy, lambda r: bool(r["audios"]), lambda r: change(r["audios"][0]))
    report = verify_build(copy)
    assert not report.ok and any(text in v.what for v in report.violations), report.violations[:4]


@pytest.mark.slow
def test_totals_labels_and_budget_are_checked(copy):
    _mutate(copy, lambda r: bool(r["audios"]), lambda r: r.__setitem__("num_audio_tokens", r["num_audio_tokens"] + 1))
    assert any("num_audio_tokens is" in v.what for v in verify_build(copy).violations)


@pytest.mark.slow
def test_audio_label_and_budget(copy):
    def label(row):
        a = row["audios"][0]
        row["labels"][a["offset"]] = row["input_ids"][a["offset"]]
        row["num_loss_tokens"] += 1
    _mutate(copy, lambda r: bool(r["audios"]), label)
    report = verify_build(copy)
    assert any("audio token carries a label" in v.what for v in report.violations)
    manifest = _manifest(copy)
    manifest["config"]["max_audio_tokens"] = 20
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert any("audio tokens > max_audio_tokens 20" in v.what for v in verify_build(copy).violations)


@pytest.mark.slow
def test_audio_budgets_reject_what_never_fits(corpus):
    result = build(_config(corpus, "tight", max_audio_tokens=20, max_audios=1), progress=False)
    rejects = [json.loads(x) for x in (corpus / "tight" / "rejects.jsonl").read_text().splitlines()]
    over = [r for r in rejects if r["reason"] == "overlong"]
    assert over and all("exceed --max-audio-tokens / --max-audios" in r["message"] for r in over)
    rows = _rows(corpus / "tight")
    assert all(len(r["audios"]) <= 1 and r["num_audio_tokens"] <= 20 for r in rows)
    assert result.stats["rejects_by_reason"]["overlong"] == len(over)
    assert verify_build(corpus / "tight").ok


@pytest.mark.slow
def test_a_profile_without_audio_rejects_every_clip(corpus):
    config = BuildConfig.from_inputs([str(corpus / "data.jsonl")], str(corpus / "text-out"), profile="text",
                                     max_length=160)
    build(config, progress=False)
    rejects = [json.loads(x) for x in (corpus / "text-out" / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 6 * 4 and {r["reason"] for r in rejects} == {"unsupported_medium"}
    assert all("takes no audio" in r["message"] and r["line"] >= 1 for r in rejects)



@pytest.mark.slow
def test_the_default_reader_decodes_only_the_rows_clips(built, corpus):
    """Collate: each clip's window decoded and made into Whisper log-mel features (the default reader), equal to
    ``WhisperFeatureExtractor`` on the clip as its loader yields it; ``audio_offsets`` point at each clip's run."""
    from transformers import WhisperFeatureExtractor

    from packer.train.collate import collate
    from packer.train.dataset import PackedDataset

    rows = [r for r in PackedDataset(built, shuffle=False) if len(r["audios"])][:3]
    batch = collate(rows)
    audios = [a for r in rows for a in r["audios"]]
    feats, mask = batch["input_features"], batch["feature_attention_mask"]
    assert tuple(feats.shape) == (len(audios), 128, 3000) and tuple(mask.shape) == (len(audios), 3000)
    assert mask.sum(1).tolist() == [a["feature_length"] for a in audios]
    for s, a in zip(batch["audio_offsets"].tolist(), audios, strict=True):
        assert (batch["input_ids"][0, s : s + a["num_tokens"]] == 151650).all()
    extractor = WhisperFeatureExtractor(feature_size=128)
    for k, a in enumerate(audios):
        source = a["data"] if a["data"] is not None else a["source"]
        y = decode_audio(source, target_sr=16000, start=a["audio_start"], end=a["audio_end"])
        ref = extractor(y, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="np")
        np.testing.assert_array_equal(mask[k].numpy(), ref["attention_mask"][0])
        np.testing.assert_allclose(feats[k].numpy(), ref["input_features"][0], atol=1e-4)
    assert "audio_offsets" not in __import__("packer.train.hf", fromlist=["model_inputs"]).model_inputs(batch)
    # a clip whose file changed since the build is refused, not read wrongly
    (corpus / "clips" / "a.wav").rename(corpus / "clips" / "a.bak")
    write_clip(corpus / "clips" / "a.wav", signal("tone", 22050, 0.5), 22050)
    try:
        changed = [r for r in PackedDataset(built, shuffle=False) if any(
            Path(a["source"]).name == "a.wav" for a in r["audios"])][:1]
        with pytest.raises(Exception, match="the build counted"):
            collate(changed)
    finally:
        (corpus / "clips" / "a.bak").replace(corpus / "clips" / "a.wav")


@pytest.mark.slow
def test_inspect_lists_a_rows_clips(built):
    from click.testing import CliRunner

    from packer.cli import cli

    row = next(i for i, r in enumerate(_rows(built)) if r["audios"])
    result = CliRunner().invoke(cli, ["inspect", str(built), "--row", str(row)])
    assert result.exit_code == 0, result.output
    clips = _rows(built)[row]["audios"]
    lines = [x for x in result.output.splitlines() if x.strip().startswith("audio ")]
    assert len(lines) == len(clips)
    a = clips[0]
    assert f"[{a['offset']}, {a['offset'] + a['num_tokens']})" in lines[0]
    assert f"{a['feature_length']:,} feature frames" in lines[0] and f"{a['num_samples'] / 16000:.2f} s" in lines[0]


def test_a_linear_audio_build_is_not_called_trl_exact(corpus):
    """Rows of one-node examples with clips keep ``seq_lengths`` null (the clips' spans), so the card keeps every
    column: the card's check loops over every medium of the table, audio too, not images and videos alone."""
    config = BuildConfig.from_inputs([str(corpus / "bytes.parquet")], str(corpus / "linear"), profile="toy",
                                     chat_template=str(corpus / "toy.jinja"), max_length=160)
    build(config, progress=False)
    card = (corpus / "linear" / "README.md").read_text()
    assert "columns:" not in card and "name: audios" in card
    assert all(r["seq_lengths"] is None for r in _rows(corpus / "linear"))
