"""Hand-built layouts, examples and shard sets for tests of the tree ops, the shard layer and the reader
(no tokenizer needed); small pieces the family tests share."""

from __future__ import annotations

import importlib.util
import random
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packer.config import BuildConfig
from packer.core.tree import tree_position_ids
from packer.core.types import IGNORE_INDEX, Encoded, EncodedImage
from packer.shards.assemble import assemble_packs, encoded_table
from packer.shards.io import read_shard, write_json_atomic, write_shard
from packer.shards.schema import SCHEMA_VERSION, Manifest, ShardEntry, Totals

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str) -> types.ModuleType:
    """``scripts/<name>.py`` imported as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# packer.core.tree's docstring row: example 0 = prefix P (node 0) with branches a (1) and b (2); example 1 = Q.
GOLDEN_LAYOUT = dict(num_tokens=10, cu_seqlens=[0, 8, 10], node_offsets=[0, 3, 5, 8], node_parents=[-1, 0, 0, -1])


def random_layout(rng: random.Random, *, examples: int = 4, max_len: int = 12, max_nodes: int = 5) -> dict:
    """A random row: examples of random trees (depth-first, parents first), some of one token."""
    cu, offsets, parents, t = [0], [], [], 0
    for _ in range(examples):
        length = rng.choice([1, rng.randint(1, max_len)])
        n = rng.randint(1, min(max_nodes, length))
        starts = sorted(rng.sample(range(1, length), n - 1)) if n > 1 else []
        base = len(offsets)
        chain: list[int] = []  # ancestors of the previous node; a depth-first child hangs off one of them
        for i, s in enumerate([0, *starts]):
            offsets.append(t + s)
            if i == 0:
                parents.append(-1)
                chain = [base]
            else:
                depth = rng.randrange(len(chain))
                parents.append(chain[depth])
                chain = chain[: depth + 1] + [base + i]
        t += length
        cu.append(t)
    return dict(num_tokens=t, cu_seqlens=cu, node_offsets=offsets, node_parents=parents)


def random_spans(rng: random.Random, layout: dict, *, p: float = 0.7) -> list[tuple[int, int]]:
    """Random bidirectional spans for ``random_layout``'s row: at most one per node, inside it (as images are),
    of 1 token up to the whole node."""
    ends = [*layout["node_offsets"][1:], layout["num_tokens"]]
    spans = []
    for a, b in zip(layout["node_offsets"], ends, strict=True):
        if rng.random() < p:
            s = rng.randrange(a, b)
            spans.append((s, rng.randint(s + 1, b)))
    return spans



def random_tree(rng: np.random.Generator, length: int, max_nodes: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Random depth-first node layout of ``length`` tokens: (node_offsets, node_parents)."""
    n = int(rng.integers(1, min(max_nodes, length) + 1))
    offsets = np.sort(rng.choice(np.arange(1, length), size=n - 1, replace=False)) if n > 1 else np.zeros(0, int)
    offsets = np.concatenate([[0], offsets]).astype(np.int32)
    parents = [-1]
    path = [0]  # the ancestors chain of the previous node: a depth-first child hangs off one of them
    for i in range(1, n):
        depth = int(rng.integers(0, len(path)))
        parents.append(path[depth])
        path = path[: depth + 1] + [i]
    return offsets, np.array(parents, dtype=np.int32)


def random_example(rng: np.random.Generator, i: int, *, max_len: int = 40, images: bool = False,
                   mrope: bool = False) -> Encoded:
    length = int(rng.integers(2, max_len + 1))
    offsets, parents = random_tree(rng, length)
    ids = rng.integers(0, 151000, size=length).astype(np.int32)
    labels = np.where(rng.random(length) < 0.5, ids, IGNORE_INDEX).astype(np.int32)
    labels[0] = IGNORE_INDEX
    labels[-1] = ids[-1]
    imgs = []
    if images and length > 6:
        imgs.append(EncodedImage(source=f"/img/{i}.jpg", data=None, grid_thw=(1, 2, 2), offset=2, num_tokens=1))
    pos = tree_position_ids(length, offsets, parents)
    mr = np.stack([pos, pos + 1, pos + 2]).astype(np.int32) if mrope else None
    return Encoded(example_id=f"f.jsonl:{i + 1}", input_ids=ids, labels=labels, position_ids=pos,
                   node_offsets=offsets, node_parents=parents, images=imgs, mrope_position_ids=mr)


def write_shardset(root: Path, examples: list[Encoded], pack_sizes: list[int], *, rows_per_shard: int = 4,
                   rows_per_row_group: int = 2, profile: str = "text") -> Path:
    """Write examples (consecutive groups of pack_sizes) as a finished shard set with a manifest."""
    root.mkdir(parents=True, exist_ok=True)
    table = encoded_table(examples)
    bounds = np.concatenate([[0], np.cumsum(pack_sizes)])
    entries = []
    for s, p0 in enumerate(range(0, len(pack_sizes), rows_per_shard)):
        p1 = min(len(pack_sizes), p0 + rows_per_shard)
        rows = table.slice(int(bounds[p0]), int(bounds[p1] - bounds[p0]))
        packed = assemble_packs(rows, np.array(pack_sizes[p0:p1]))
        entries.append(write_shard(packed, root / f"shard-{s:05d}.parquet", rows_per_row_group=rows_per_row_group))
    write_json_atomic(root / "stats.json", {})
    (root / "rejects.jsonl").write_text("")
    longest = max(int(sum(len(e.input_ids) for e in examples[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        config=BuildConfig.from_inputs(["f.jsonl"], str(root), profile=profile, max_length=longest),
        profile=profile, inputs=("f.jsonl",), base_dir=str(root),
        totals=Totals(input_records=len(examples), rejected=0, rejects_by_reason={}, examples=len(examples),
                      packs=len(pack_sizes), tokens=sum(len(e.input_ids) for e in examples),
                      loss_tokens=sum(int((e.labels != IGNORE_INDEX).sum()) for e in examples),
                      vision_tokens=sum(im.num_tokens for e in examples for im in e.images)),
        shards=tuple(ShardEntry(**e) for e in entries),
    )
    write_json_atomic(root / "manifest.json", manifest.to_dict())
    return root


def leaf_chains(offsets: list[int], parents: list[int], ends, nodes) -> list[np.ndarray]:
    """Positions of each root-to-leaf path through ``nodes`` (node n holds ``offsets[n]:ends[n]``), leaves in node
    order."""
    out = []
    for leaf in (n for n in nodes if n not in parents):
        chain, n = [], leaf
        while n >= 0:
            chain.append(n)
            n = parents[n]
        out.append(np.concatenate([np.arange(offsets[n], ends[n]) for n in reversed(chain)]))
    return out


def encode_records(tokenizer: Any, profile: Any, records: list[dict], media: Path, *, path: str) -> list[Encoded]:
    """Each record through ``Encoder(tokenizer, profile)`` as line i + 1 of ``path``, its media under ``media``."""
    from packer.encode.encoder import Encoder
    from packer.formats import parse_record

    encoder = Encoder(tokenizer, profile)
    return [encoder.encode(parse_record(r, path=path, line=i + 1, base_dir=str(media))) for i, r in enumerate(records)]


def token_paths(enc: Encoded) -> list[np.ndarray]:
    """Token positions of each root-to-leaf path of an encoded example, leaves in node order."""
    offs, parents = enc.node_offsets.tolist(), enc.node_parents.tolist()
    return leaf_chains(offs, parents, [*offs[1:], len(enc.input_ids)], range(len(offs)))


def without_video_processor(processor_class: type) -> type:
    """``processor_class`` (a transformers processor) taking ``video_processor=None``: a video processor class needs
    torchvision; its audio, image and text code unchanged."""

    class _Processor(processor_class):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return _Processor


def qwen2vl_video_processor(**kwargs: Any) -> tuple[Any, Any]:
    """transformers' ``Qwen2VLVideoProcessor(**kwargs)`` (the one the Omni processors load), its module's own
    source run with torchvision's two calls it makes here (bicubic antialiased resize, normalize) done in torch;
    and the MonkeyPatch that routes transformers' video backend to them (``undo()`` it after)."""
    import enum
    import importlib.util
    import sys
    from pathlib import Path

    import pytest
    import torch
    import torch.nn.functional as F
    import transformers.image_processing_backends as backends
    from transformers.image_utils import ChannelDimension, PILImageResampling
    from transformers.video_utils import convert_to_rgb

    class Interpolation(enum.Enum):
        NEAREST = 0
        LANCZOS = 1
        BILINEAR = 2
        BICUBIC = 3

    def resize(video, size, interpolation, antialias=True):
        assert interpolation == Interpolation.BICUBIC
        flat = video.reshape(-1, *video.shape[-3:])
        out = F.interpolate(flat, size=list(size), mode="bicubic", align_corners=False, antialias=antialias)
        return out.reshape(*video.shape[:-3], *out.shape[-3:])

    def normalize(x, mean, std, inplace=False):
        mean = torch.as_tensor(mean, dtype=x.dtype).view(-1, 1, 1)
        return x.sub(mean).div(torch.as_tensor(std, dtype=x.dtype).view(-1, 1, 1))

    tvf = types.SimpleNamespace(InterpolationMode=Interpolation, resize=resize, normalize=normalize)
    name = "transformers.models.qwen2_vl.video_processing_qwen2_vl"
    origin = importlib.util.find_spec(name).origin
    module = types.ModuleType("_qwen2vl_video_processing_without_torchvision")
    module.__file__, module.__package__, module.tvF = origin, "transformers.models.qwen2_vl", tvf
    sys.modules[module.__name__] = module  # auto_docstring looks the class's source file up by its module
    source = Path(origin).read_text().replace("import torchvision.transforms.v2.functional as tvF\n", "")
    exec(compile(source, origin, "exec"), module.__dict__)  # noqa: S102

    class VideoProcessor(module.Qwen2VLVideoProcessor):
        def convert_to_rgb(self, video):
            return convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)

    mp = pytest.MonkeyPatch()
    mp.setattr(backends, "tvF", tvf, raising=False)
    mp.setattr(backends, "pil_torch_interpolation_mapping",
               {PILImageResampling.BICUBIC: Interpolation.BICUBIC, PILImageResampling.BILINEAR: Interpolation.BILINEAR})
    return VideoProcessor(**kwargs), mp


def gemma4_video_processor_class() -> type:
    """transformers' ``Gemma4VideoProcessor``: its module's source run with ``tvF`` = torchvision's calls in torch
    (its class annotations name ``tvF``: it cannot be imported without torchvision). Built once."""
    global _GEMMA4_VIDEO
    if _GEMMA4_VIDEO is not None:
        return _GEMMA4_VIDEO
    import enum
    import importlib.util
    import sys

    import torch
    import torch.nn.functional as F

    class Interpolation(enum.Enum):
        NEAREST = 0
        BILINEAR = 2
        BICUBIC = 3

    def resize(video: torch.Tensor, size: list[int], interpolation, antialias: bool = True) -> torch.Tensor:
        # torchvision v2 resize_image for what Gemma4VideoProcessor gives it: a CPU uint8 (T, 3, H, W) tensor and
        # bicubic (its resample 3), run by torch's native uint8 kernel
        assert int(getattr(interpolation, "value", interpolation)) == 3 and video.dtype == torch.uint8
        return F.interpolate(video, size=list(size), mode="bicubic", align_corners=False, antialias=antialias)

    def normalize(x: torch.Tensor, mean, std, inplace: bool = False) -> torch.Tensor:
        mean = torch.as_tensor(mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=x.dtype).view(-1, 1, 1)
        return x.sub_(mean).div_(std) if inplace else x.sub(mean).div(std)

    name = "transformers.models.gemma4.video_processing_gemma4"
    origin = importlib.util.find_spec(name).origin
    module = types.ModuleType("_gemma4_video_processing_without_torchvision")
    module.__file__, module.__package__ = origin, "transformers.models.gemma4"
    module.tvF = types.SimpleNamespace(InterpolationMode=Interpolation, resize=resize, normalize=normalize)
    sys.modules[module.__name__] = module  # auto_docstring looks the class's source file up by its module
    exec(compile(Path(origin).read_text(), origin, "exec"), module.__dict__)  # noqa: S102

    class Gemma4VideoProcessorTorch(module.Gemma4VideoProcessor):
        def normalize(self, image, mean, std, inplace=False, **kwargs):  # TorchvisionBackend's, tvF.normalize
            return normalize(image, mean, std, inplace)

        def convert_to_rgb(self, video):  # BaseVideoProcessor's: tvF.grayscale_to_rgb keeps 3 channels as they are
            from transformers.image_utils import ChannelDimension
            from transformers.video_utils import convert_to_rgb

            assert video.shape[-3] == 3
            return convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)

    _GEMMA4_VIDEO = Gemma4VideoProcessorTorch
    return _GEMMA4_VIDEO


_GEMMA4_VIDEO: type | None = None


def write_omni_media(root: Path) -> Path:
    """The Omni tests' media under ``root``: clips in four codecs and rates (wav stereo, mp3, flac, m4a stereo),
    two mp4 videos with sound (one a 22.05 kHz mono track), and two images of odd sizes."""
    from PIL import Image

    from tests.media.audio_clips import write_four_clips, write_video

    write_four_clips(root)
    write_video(root / "movie.mp4", seconds=4.5, fps=10, size=(64, 48))
    write_video(root / "long.mp4", seconds=7.3, fps=8, size=(80, 60), sample_rate=22050, channels=1)
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(root / "pic.png")
    Image.fromarray(rng.integers(0, 256, (300, 41, 3), dtype=np.uint8)).save(root / "tall.png")
    return root


def record_paths(record: dict) -> list[list[dict]]:
    """A chat record's root-to-leaf message lists (``branches`` of lists or of nested nodes), leaves in order."""

    def walk(prefix, node):
        msgs = prefix + (node if isinstance(node, list) else node["messages"])
        branches = [] if isinstance(node, list) else node.get("branches", [])
        return [p for b in branches for p in walk(msgs, b)] or [msgs]

    return walk([], record)


def omni_path_media(msgs: list[dict], enc: Encoded, cols: np.ndarray, media: Path, *, with_sound: bool
                    ) -> tuple[list, list, list, list, list]:
    """What qwen-omni-utils hands an Omni processor for one path: (audio clips at 16 kHz, each clip's video
    index or None (``audio_from_video_indices``), PIL images, each video's frames resized as ``fetch_video`` does
    (from the encoded entry's sampled frames and utils size), the videos' encoded entries)."""
    import torch
    from PIL import Image

    from packer.media.audio import decode_audio
    from packer.media.video import decode_frames

    on_path = set(cols.tolist())
    audio, slots, images, videos, entries = [], [], [], [], []
    for m in msgs:
        for part in m["content"] if isinstance(m["content"], list) else []:
            if part["type"] == "audio":
                audio.append(decode_audio(str(media / part["audio"]), target_sr=16000,
                                          start=part.get("audio_start"), end=part.get("audio_end")))
                slots.append(None)
            elif part["type"] == "image":
                images.append(Image.open(media / part["image"]).convert("RGB"))
            elif part["type"] == "video":
                entry = next(v for v in enc.videos if v.offset in on_path)
                frames = torch.from_numpy(decode_frames(entry.source, entry.frame_indices)).permute(0, 3, 1, 2)
                size = (entry.utils_height, entry.utils_width)  # qwen-omni-utils' fetch_video resize
                frames = torch.nn.functional.interpolate(frames.float(), size=size, mode="bicubic",
                                                         antialias=True).clamp(0, 255)
                if with_sound:
                    audio.append(decode_audio(entry.source, target_sr=16000, video=True))
                    slots.append(len(videos))
                videos.append(frames)
                entries.append(entry)
    return audio, slots, images, videos, entries


def omni_processor_out(processor, msgs: list[dict], enc: Encoded, cols: np.ndarray, media: Path, *,
                       with_sound: bool) -> tuple[Any, list, list]:
    """An Omni processor's output (``return_tensors="pt"``) for one path: its chat template's text with the path's
    media (``omni_path_media``; the videos' sound loaded where the record uses it); also the path's audio clips and
    its videos' encoded entries."""
    audio, slots, images, videos, video_entries = omni_path_media(msgs, enc, cols, media, with_sound=with_sound)
    text = processor.apply_chat_template(msgs, tokenize=False)
    kw = dict(load_audio_from_video=True, audio_from_video_indices=slots) if with_sound and videos else {}
    # a part's fps is what a user hands on to the processor (its video_second_per_grid)
    fps = [p["fps"] for m in msgs if isinstance(m["content"], list) for p in m["content"] if "fps" in p]
    videos_kwargs = {"do_sample_frames": False, **({"fps": fps[0]} if fps else {})}
    out = processor(text=[text], audio=audio or None, images=images or None, videos=videos or None,
                    videos_kwargs=videos_kwargs, return_tensors="pt", **kw)
    return out, audio, video_entries


def tiny_model_report(profile: Any, tok: Any, batch: dict, *, paths: int) -> tuple[dict, Any]:
    """``scripts/check_equivalence``'s proof of ``batch`` on the family's tiny model (seed 0, the vocabulary
    compacted to the batch's ids): on sdpa_varlen and sdpa every path's losses and gradients equal it alone and
    every parameter gets a gradient, over ``paths`` paths. The report and the model."""
    import json

    import torch

    from scripts import check_equivalence as ce

    (batch,), ids, vocab = ce.compact_vocab([batch], ce.profile_token_ids(profile, tok))
    torch.manual_seed(0)
    model = profile.proof().tiny_model(token_ids=ids, vocab_size=vocab)
    report = ce.compare(model, batch, ["sdpa_varlen", "sdpa"], profile=profile, token_ids=ids)
    for backend in ("sdpa_varlen", "sdpa"):
        assert report[backend]["ok"], json.dumps(report)
        assert report[backend]["grad_missing"] == [] and report[backend]["grad_params"] > 0
    assert report["paths"] == paths
    return report, model


SOUND_TRACK_FAULTS = {  # break_sound_track's faults -> what verify reports (any of)
    # a frame's last token and the sound's first change places: the frames' runs no longer make whole frames
    "frame and sound swapped": {"video grid", "audio spans", "mrope_position_ids"},
    "sound track offset": {"audio spans"},
    "position": {"mrope_position_ids"},
    "stray audio token": {"audio tokens"},
}


def break_sound_track(row: dict, fault: str, *, audio_id: int, position_step: float) -> None:
    """The faults verify must find in an Omni row holding a video's sound: the frame before the track and the
    track's first token swapped, the track's entry off its run, a position of the track moved by
    ``position_step``, a stray audio token (the row's first token)."""
    track = next(a for a in row["audios"] if a["video"])
    if fault == "frame and sound swapped":
        ids, k = row["input_ids"], track["offset"]
        ids[k - 1], ids[k] = ids[k], ids[k - 1]
    elif fault == "sound track offset":
        track["offset"] += 1
    elif fault == "position":
        row["mrope_position_ids"][3 * (track["offset"] + 2)] += position_step
    elif fault == "stray audio token":
        row["input_ids"][0] = audio_id
    else:
        raise KeyError(fault)


def rewrite_shard(out: Path, change, *, shard: int = 0) -> None:
    """Rewrite one shard of a finished build with ``change(rows)`` applied to its rows (a list of dicts, changed
    in place), its manifest entry's checksum and size updated: a corrupted build for verify to find."""
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["shards"][shard]
    rows = read_shard(out / entry["file"]).to_pylist()
    change(rows)
    new = write_shard(stored_table(rows), out / entry["file"], rows_per_row_group=2)
    manifest["shards"][shard] = {**entry, "sha256": new["sha256"], "bytes": new["bytes"]}
    write_json_atomic(out / "manifest.json", manifest)


def stored_table(rows: list[dict]) -> pa.Table:
    """Rows as readers see them (``ROW_SCHEMA``: the dense mRoPE column, what ``read_shard`` gives) as the table a
    shard of this schema version stores (v6: the mRoPE column sparse)."""
    from packer.shards.mrope import to_sparse
    from packer.shards.schema import ROW_SCHEMA

    return to_sparse(pa.Table.from_pylist(rows, schema=ROW_SCHEMA))


def assert_verify_finds(built_out: Path, tmp_path: Path, change, want: set[str]) -> None:
    """A copy of the build ``built_out`` with ``change(rows)`` applied to its first shard (``rewrite_shard``)
    fails verify, on one of the checks named in ``want`` at least."""
    import shutil

    from packer.report.verify import verify_build

    out = tmp_path / "out"
    shutil.copytree(built_out, out)
    rewrite_shard(out, change)
    report = verify_build(out)
    assert not report.ok
    assert want & {check for _, check in report.counts}, report.lines()


def check_omni_tree(rng: np.random.Generator, with_sound: bool, random_sequence, position_ids, reference) -> None:
    """A root and two branches, each ``random_sequence(rng, with_sound)``: ``position_ids(ids, offsets, parents,
    blocks)`` of the tree, on every root-to-leaf path, equals ``reference(path ids, image grids, video grids,
    seconds per grid, clips' frames)`` on that path alone (0..L-1 on a path with no image or video: the 1-D
    branch of get_rope_index)."""
    from packer.models.qwen_omni.rope import Block

    parts = [random_sequence(rng, with_sound) for _ in range(3)]
    ids, blocks, offsets = [], [], []
    for p_ids, p_blocks, *_ in parts:
        offsets.append(len(ids))
        blocks += [Block(b.start + len(ids), b.end + len(ids), b.kind, b.grid, b.second_per_grid, b.audio_tokens)
                   for b in p_blocks]
        ids += p_ids
    got = position_ids(ids, np.array(offsets), np.array([-1, 0, 0]), blocks)
    ends = [*offsets[1:], len(ids)]
    for path in ([0, 1], [0, 2]):
        cols = np.concatenate([np.arange(offsets[n], ends[n]) for n in path])
        merged = [parts[n] for n in path]
        igr, vgr, spg, aud = ([g for m in merged for g in m[k]] for k in (2, 3, 4, 5))
        if not igr and not vgr:
            np.testing.assert_array_equal(got[:, cols], np.broadcast_to(np.arange(len(cols)), (3, len(cols))))
            continue
        np.testing.assert_array_equal(got[:, cols], reference([ids[c] for c in cols], igr, vgr, spg, aud))


def random_omni_sequence(rng: np.random.Generator, with_sound: bool, *, tokens: dict[str, int], frames_for,
                         av_kinds, seconds_per_grid: tuple[float, ...]):
    """A random Omni sequence for positions tests: text, images, audio clips and videos (with their sound when
    ``with_sound``), as (ids, blocks, image grids, video grids, seconds per grid, each clip's mel frames).
    ``tokens`` names the family's ids (image, video, audio, vision_start/end, audio_start/end), ``frames_for(n)``
    gives a clip of n tokens' frames, ``av_kinds(grid, spg, n)`` the processor's video/audio order (0 video)."""
    from packer.models.qwen_omni.rope import Block

    t = tokens
    ids, blocks, igr, vgr, spg, aud = [], [], [], [], [], []
    for _ in range(int(rng.integers(1, 5))):
        ids += rng.integers(0, 1000, int(rng.integers(1, 6))).tolist()
        kind = rng.choice(["image", "audio", "video"])
        if kind == "image":
            g = (1, 2 * int(rng.integers(1, 5)), 2 * int(rng.integers(1, 5)))
            ids.append(t["vision_start"])
            s = len(ids)
            ids += [t["image"]] * (g[1] * g[2] // 4)
            blocks.append(Block(s, len(ids), "image", g))
            ids.append(t["vision_end"])
            igr.append(g)
        elif kind == "audio":
            n = int(rng.integers(1, 130))
            ids.append(t["audio_start"])
            s = len(ids)
            ids += [t["audio"]] * n
            blocks.append(Block(s, len(ids), "audio"))
            ids.append(t["audio_end"])
            aud.append(int(frames_for(n)))
        else:
            g = (int(rng.integers(1, 8)), 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4)))
            sp = float(rng.choice(seconds_per_grid))
            vgr.append(g)
            spg.append(sp)
            if with_sound:
                n = int(rng.integers(1, 200))
                aud.append(int(frames_for(n)))
                ids += [t["vision_start"], t["audio_start"]]
                s = len(ids)
                ids += np.where(av_kinds(g, sp, n) == 0, t["video"], t["audio"]).tolist()
                blocks.append(Block(s, len(ids), "av", g, sp, n))
                ids += [t["audio_end"], t["vision_end"]]
            else:
                ids.append(t["vision_start"])
                s = len(ids)
                ids += [t["video"]] * (g[0] * g[1] * g[2] // 4)
                blocks.append(Block(s, len(ids), "video", g, sp))
                ids.append(t["vision_end"])
    ids += rng.integers(0, 1000, int(rng.integers(0, 4))).tolist()
    return ids, blocks, igr, vgr, spg, aud
