"""The released checkpoints' constants, one cited fixture per family (``<family>.json``), and the one place that
maps a fixture's keys to a profile's values (``PROFILE_VALUE``: rename a profile attribute here, nowhere else).

A fixture holds, per profile, the values each released file sets (``files[name]["values"]``) and where they were
read (``files[name]["source"]``: the checkpoint repo and revision, or the public copy they were read from; "not
found" says so). ``checkpoint_dir`` writes them back as a checkpoint directory's files, for tests of what a
user's ``--tokenizer <dir>`` says.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

# (file, key) -> the profile's value for it, every family alike; ``FAMILY_VALUE`` where a family names the same
# file key otherwise. Files named "tokenizer" map token strings to ids and are compared against the builtin
# tokenizer instead; config.json's token ids through ``TOKEN_KEYS``.
P = "preprocessor_config.json"
PROFILE_VALUE: dict[tuple[str, str], Callable[[Any], Any]] = {
    (P, "min_pixels"): lambda p: p.min_pixels,
    (P, "max_pixels"): lambda p: p.max_pixels,
    (P, "size.shortest_edge"): lambda p: p.min_pixels,  # Qwen3-VL / GLM's size = pixel bounds
    (P, "size.longest_edge"): lambda p: p.max_pixels,
    (P, "patch_size"): lambda p: p.patch_size,
    (P, "merge_size"): lambda p: p.merge_size,
    (P, "temporal_patch_size"): lambda p: p.temporal_patch_size,
    # normalization: the profile's, else the one its reader's image processor applies
    (P, "image_mean"): lambda p: _norm(p, "image_mean"),
    (P, "image_std"): lambda p: _norm(p, "image_std"),
    # audio: what the reader pads/cuts to and the count rule's cap, from the profile
    (P, "sampling_rate"): lambda p: p.audio.sample_rate,
    (P, "feature_size"): lambda p: p.reader().audio_feature_size,
    (P, "chunk_length"): lambda p: p.reader().audio_chunk_length,
    (P, "n_samples"): lambda p: p.reader().audio_chunk_length * p.audio.sample_rate,
    (P, "nb_max_frames"): lambda p: _max_frames(p),
    # video: the profile's video rule (shared/qwen_video_plan.py's VideoFamily)
    ("video_preprocessor_config.json", "patch_size"): lambda p: p.video.family().patch_size,
    ("video_preprocessor_config.json", "merge_size"): lambda p: p.video.family().merge_size,
    ("video_preprocessor_config.json", "temporal_patch_size"): lambda p: p.video.family().temporal_patch_size,
}

FAMILY_VALUE: dict[str, dict[tuple[str, str], Callable[[Any], Any]]] = {
    "gemma3": {
        (P, "size.height"): lambda p: p.image_px, (P, "size.width"): lambda p: p.image_px,
        (P, "image_seq_length"): lambda p: p.tokens_per_image, (P, "do_pan_and_scan"): lambda p: p.do_pan_and_scan,
        ("processor_config.json", "image_seq_length"): lambda p: p.tokens_per_image,
        ("config.json", "mm_tokens_per_image"): lambda p: p.tokens_per_image,
    },
    "gemma4": {
        ("processor_config.json", "image_processor.patch_size"): lambda p: p.patch_size,
        ("processor_config.json", "image_processor.pooling_kernel_size"): lambda p: p.pooling_kernel_size,
        ("processor_config.json", "image_processor.max_soft_tokens"): lambda p: p.max_soft_tokens,
        ("processor_config.json", "video_processor.max_soft_tokens"): lambda p: p.video_max_soft_tokens,
        ("processor_config.json", "video_processor.num_frames"): lambda p: p.video_num_frames,
        ("processor_config.json", "audio_seq_length"): lambda p: int(p.audio.num_tokens(_frames(p, 10**9))[0]),
        ("processor_config.json", "feature_extractor.sampling_rate"): lambda p: p.audio.sample_rate,
        ("processor_config.json", "feature_extractor.feature_size"): lambda p: _gemma4_audio("MEL_BINS"),
        ("processor_config.json", "feature_extractor.frame_length"): lambda p: _gemma4_audio("FRAME_LENGTH"),
        ("processor_config.json", "feature_extractor.hop_length"): lambda p: _gemma4_audio("HOP"),
        ("processor_config.json", "feature_extractor.fft_length"): lambda p: _gemma4_audio("FFT_LENGTH"),
    },
    "smolvlm": {
        (P, "size.longest_edge"): lambda p: p.longest_edge, (P, "max_image_size.longest_edge"): lambda p: p.tile_px,
        (P, "do_image_splitting"): lambda p: p.do_image_splitting,
        ("processor_config.json", "image_seq_len"): lambda p: (p.tile_px // p.patch_size // p.scale_factor) ** 2,
    },
    "mistral3": {
        (P, "size.longest_edge"): lambda p: p.longest_edge, (P, "patch_size.height"): lambda p: p.patch_size,
        ("config.json", "spatial_merge_size"): lambda p: p.spatial_merge_size,
    },
    "llava": {
        (P, "crop_size.height"): lambda p: p.image_px, (P, "size.shortest_edge"): lambda p: p.image_px,
        ("config.json", "vision_config.patch_size"): lambda p: p.patch_size,
    },
    "internvl": {
        (P, "size.height"): lambda p: p.tile_px, (P, "min_patches"): lambda p: p.min_tiles,
        (P, "max_patches"): lambda p: p.max_tiles,
        ("processor_config.json", "image_seq_length"): lambda p: p.tokens_per_tile,
    },
    "llava_onevision": {(P, "size.height"): lambda p: p.crop_px},
    "llama4": {
        (P, "size.height"): lambda p: p.tile_px, (P, "max_patches"): lambda p: p.max_patches,
        (P, "resize_to_max_canvas"): lambda p: p.resize_to_max_canvas,
    },
    "molmo2": {
        (P, "crop_px"): lambda p: p.crop_px, (P, "max_crops"): lambda p: p.max_crops,
        (P, "video_num_frames"): lambda p: p.video_max_frames, (P, "video_max_fps"): lambda p: p.video_max_fps,
    },
}


# config.json keys that name a token id -> the profile attribute holding that token's string
TOKEN_KEYS = {
    "audio_token_index": "audio_token", "audio_token_id": "audio_token", "image_token_index": "image_token",
    "image_token_id": "image_token", "video_token_index": "video_token", "video_token_id": "video_token",
    "audio_start_token_id": "audio_start", "audio_end_token_id": "audio_end",
    "vision_start_token_id": "vision_start", "vision_end_token_id": "vision_end",
}

# Keys a fixture records but no profile value stands for (the processor's own defaults, or values the profile
# takes from the processor's call rather than the file): listed so a new key is a decision, not a miss.
RECORDED_ONLY = {
    "feature_extractor_type", "image_processor_type", "video_processor_type", "processor_class", "dither",
    "padding_side", "padding_value", "return_attention_mask", "hop_length", "n_fft", "position_id_per_seconds",
    "seconds_per_chunk", "padding", "truncation",
}


def profile_value(family: str, file: str, key: str) -> Callable[[Any], Any] | None:
    """How to read the profile's value for a fixture key (None: recorded only)."""
    return FAMILY_VALUE.get(family, {}).get((file, key)) or PROFILE_VALUE.get((file, key))

def _norm(profile: Any, name: str) -> list[float]:
    value = getattr(profile, name, None)
    if value is None:
        value = getattr(profile.reader().make_image_processor(), name)
    return [float(x) for x in value]


def _frames(profile: Any, samples: int) -> Any:
    import numpy as np

    return profile.audio.feature_lengths(np.array([samples], dtype=np.int64), np.full(1, -1, dtype=np.int64))


def _max_frames(profile: Any) -> int:
    """The cap of the family's frame count: the frames of a clip far longer than any chunk."""
    return int(_frames(profile, 10**9)[0])


def _gemma4_audio(*names: str) -> Any:
    from packer.models.gemma4 import audio

    return next(getattr(audio, n) for n in names if hasattr(audio, n))


def families() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def load(family: str) -> dict[str, Any]:
    return json.loads((HERE / f"{family}.json").read_text())


def released_profiles() -> list[tuple[str, str, dict[str, Any]]]:
    """(family, profile name, that profile's fixture entry) for every fixture."""
    return [(f, name, entry) for f in families() for name, entry in load(f)["profiles"].items()]


def file_values(entry: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(entry["files"].get(name, {}).get("values", {}))


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """A fixture's dotted keys ("size.shortest_edge") as the file's nested mappings."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def checkpoint_dir(path: Path, entry: dict[str, Any]) -> Path:
    """A checkpoint directory holding the released processor files of ``entry`` (their recorded values)."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json"):
        values = file_values(entry, name)
        if values:
            (path / name).write_text(json.dumps(nested(values), indent=2))
    return path


def whisper_extractor(entry: dict[str, Any]) -> Any:
    """transformers' WhisperFeatureExtractor configured as the released preprocessor_config.json says (what
    ``from_pretrained`` builds from it: the file's keys as constructor arguments)."""
    from transformers import WhisperFeatureExtractor

    values = file_values(entry, "preprocessor_config.json")
    keys = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "dither",
            "return_attention_mask")
    return WhisperFeatureExtractor(**{k: values[k] for k in keys if k in values})


# ---------------------------------------------------------------- the reference processors of the proofs

# What a family's Processor passes its image processor at call time, which no processor file holds, as
# ``from_pretrained`` kwargs read from the fixture: PixtralProcessor's patch_size * spatial_merge_size,
# InternVLProcessor's crop_to_patches (its images_kwargs win over the file's false), LLaVA-OneVision's crops
# concatenated rather than padded (the reader's layout: the same pixels per crop), and Molmo2's fixture keys, named
# as the profile names them (no public copy of its file was found), as the processor's arguments.
CALL_KWARGS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "mistral3": lambda e: {"patch_size": {
        side: file_values(e, P)["patch_size.height"] * file_values(e, "config.json")["spatial_merge_size"]
        for side in ("height", "width")}},
    "internvl": lambda e: {"crop_to_patches": True},
    "llava_onevision": lambda e: {"do_pad": False},
    "molmo2": lambda e: {"size": {"height": file_values(e, P)["crop_px"], "width": file_values(e, P)["crop_px"]},
                         "max_crops": file_values(e, P)["max_crops"]},
}


def family_of(profile_name: str) -> str:
    return next(f for f, name, _ in released_profiles() if name == profile_name)


def entry_of(profile_name: str) -> dict[str, Any]:
    return load(family_of(profile_name))["profiles"][profile_name]


def _squared(values: dict[str, Any]) -> dict[str, Any]:
    """A fixture's ``size.height`` without ``size.width`` is the square its file writes (448 x 448 tiles)."""
    out = dict(values)
    for key, value in values.items():
        if key.endswith(".height") and f"{key[:-7]}.width" not in values:
            out[f"{key[:-7]}.width"] = value
    return out


def image_processor(profile_name: str, *, min_pixels: int | None = None, max_pixels: int | None = None,
                    **kwargs: Any) -> Any:
    """The family's HF image processor as ``from_pretrained`` loads it from a checkpoint directory holding the
    released files (the fixture's values; the class's defaults for what the file leaves out), plus what the
    family's Processor passes at call time (``CALL_KWARGS``) and a build's own settings (``min_pixels`` /
    ``max_pixels``, the processor's other ``kwargs``). The class is the one packer's reader runs (the PIL backend of
    the file's ``image_processor_type``; torchvision is not a dependency): only the values come from the fixture,
    so a profile default that drifts from the released file gives the proof other counts than the build's."""
    import tempfile

    from packer.models import get_profile

    family, entry = family_of(profile_name), entry_of(profile_name)
    cls = type(get_profile(profile_name).reader().make_image_processor())
    pre = _squared(file_values(entry, P))
    if family == "molmo2":  # its fixture keys are the profile's names, not a file's (see CALL_KWARGS)
        pre = {}
    args = {**CALL_KWARGS.get(family, lambda e: {})(entry), **kwargs}
    if min_pixels is not None or max_pixels is not None:
        if "min_pixels" in pre:  # Qwen2-VL's file keys win over a size= kwarg
            args.update(min_pixels=min_pixels, max_pixels=max_pixels)
        else:
            args["size"] = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    with tempfile.TemporaryDirectory(prefix=f"released-{profile_name}-") as tmp:
        directory = Path(tmp)
        (directory / P).write_text(json.dumps(nested(pre)))
        proc = file_values(entry, "processor_config.json")
        if proc:
            (directory / "processor_config.json").write_text(json.dumps(nested(proc)))
        return cls.from_pretrained(str(directory), **args)


def audio_extractor(profile_name: str) -> Any:
    """The family's feature extractor as the released files configure it: ``WhisperFeatureExtractor`` from
    preprocessor_config.json (Qwen2-Audio, the Omni models), ``Gemma4AudioFeatureExtractor`` from
    processor_config.json's ``feature_extractor``."""
    entry = entry_of(profile_name)
    if family_of(profile_name) == "gemma4":
        from transformers import Gemma4AudioFeatureExtractor

        values = nested(file_values(entry, "processor_config.json"))["feature_extractor"]
        return Gemma4AudioFeatureExtractor(**values)
    return whisper_extractor(entry)


def _reference_audio_features(profile_name: str) -> Callable[..., dict[str, Any]]:
    """A reader's ``audio_features`` through the released extractor itself (not packer's numpy log-mel): each
    clip alone, as the family's processor calls it (Whisper: padded to and cut at the file's ``chunk_length``, or,
    for a clip with ``padded_samples``, padded to them uncut; Gemma 4: its own call), its mask's sum checked
    against the build's ``feature_length``."""
    import numpy as np
    import torch

    extractor = audio_extractor(profile_name)
    gemma = family_of(profile_name) == "gemma4"

    def audio_features(self: Any, samples: list[Any], audios: list[dict[str, Any]]) -> dict[str, Any]:
        feats, masks = [], []
        for y, a in zip(samples, audios, strict=True):
            if gemma:
                out = extractor([y], return_tensors="np")
                feat, mask = out["input_features"][0], out["input_features_mask"][0]
            else:
                padded = a.get("padded_samples")
                call = ({"padding": "max_length", "truncation": True} if padded is None else
                        {"padding": "max_length", "max_length": int(padded), "truncation": False})
                out = extractor(y, sampling_rate=int(a["sample_rate"]), return_attention_mask=True,
                                return_tensors="np", **call)
                feat, mask = out["input_features"][0], out["attention_mask"][0]
            frames = int(mask.sum())
            if frames != a["feature_length"]:
                raise AssertionError(f"{a['source'] or 'inline audio'}: the released extractor gives {frames} "
                                     f"feature frames, the build counted {a['feature_length']}")
            if not gemma and a.get("padded_samples") is not None:
                feat, mask = feat[:, :frames], mask[:frames]
            feats.append(feat)
            masks.append(mask)
        width = max(m.shape[0] for m in masks)
        if gemma:  # (A, T, mel) and a bool mask, padded to the longest clip
            features = np.zeros((len(feats), width, feats[0].shape[-1]), np.float32)
            mask_out = np.zeros((len(masks), width), bool)
            for i, (f, m) in enumerate(zip(feats, masks, strict=True)):
                features[i, : f.shape[0]], mask_out[i, : m.shape[0]] = f, m
            return {"input_features": torch.from_numpy(features), "input_features_mask": torch.from_numpy(mask_out)}
        features = np.zeros((len(feats), feats[0].shape[0], width), np.float32)
        mask_out = np.zeros((len(masks), width), np.int32)
        for i, (f, m) in enumerate(zip(feats, masks, strict=True)):
            features[i, :, : f.shape[1]], mask_out[i, : m.shape[0]] = f, m
        return {"input_features": torch.from_numpy(features), "feature_attention_mask": torch.from_numpy(mask_out)}

    return audio_features


# The Qwen families whose video processor runs here (its torchvision calls in torch) -> the transformers processor
# whose class ``videos_kwargs`` it passes the video processor at every call (the Omni processors' size: 128 * 28 *
# 28 .. 768 * 28 * 28, Qwen3-Omni's 32 px ones). Qwen3-VL's and Qwen3.5's is Qwen3VLVideoProcessor, the others'
# Qwen2VLVideoProcessor.
QWEN_VIDEO = {"qwen2-vl": "Qwen2VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor",
              "qwen2.5-omni": "Qwen2_5OmniProcessor", "qwen3-omni": "Qwen3OmniMoeProcessor",
              "qwen3-vl": "Qwen3VLProcessor", "qwen3.5": "Qwen3VLProcessor", "qwen3.5-moe": "Qwen3VLProcessor"}


def qwen_video_processor(profile_name: str) -> tuple[Any, dict[str, Any], Any]:
    """The family's video processor (Qwen2VLVideoProcessor, or Qwen3VLVideoProcessor for Qwen3-VL and Qwen3.5;
    torchvision's calls done in torch: ``tests.helpers``) as ``from_pretrained`` loads it from the released files
    (video_preprocessor_config.json over the preprocessor_config.json the checkpoint ships: Qwen2-VL's video
    processor reads that one), the kwargs its family's processor passes it at every call, and the MonkeyPatch to
    ``undo()`` after."""
    import tempfile

    import transformers

    from tests.helpers import qwen2vl_video_processor

    entry = entry_of(profile_name)
    video, mp = qwen2vl_video_processor()
    cls = type(video)
    if QWEN_VIDEO[profile_name] == "Qwen3VLProcessor":
        from transformers.image_utils import ChannelDimension
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
        from transformers.video_utils import convert_to_rgb

        class Qwen3VLVideoProcessorTorch(Qwen3VLVideoProcessor):  # its backend's tvF is the helper's torch one
            def convert_to_rgb(self, video):
                return convert_to_rgb(video, input_data_format=ChannelDimension.FIRST)

        cls = Qwen3VLVideoProcessorTorch
    values = {**file_values(entry, P), **file_values(entry, "video_preprocessor_config.json")}
    call = dict(getattr(getattr(transformers, QWEN_VIDEO[profile_name]), "videos_kwargs", {}))
    with tempfile.TemporaryDirectory(prefix=f"released-video-{profile_name}-") as tmp:
        (Path(tmp) / "video_preprocessor_config.json").write_text(json.dumps(nested(values)))
        return cls.from_pretrained(tmp), call, mp


def _reference_video_pixels(profile_name: str) -> tuple[Callable[..., Any], Any]:
    """``planned_video_pixels`` through the released video processor: each stored video's planned frames resized
    as qwen-vl-utils does (``tests.models.test_qwen_video.qwen_vl_utils_resize``), then the processor with
    ``do_sample_frames=False`` (and ``do_resize=False`` where the model card calls it so: Qwen3-VL, Qwen3.5)."""
    import torch

    from packer.models.shared.qwen_video_pixels import sampled_frames
    from tests.models.test_qwen_video import qwen_vl_utils_resize

    processor, call, mp = qwen_video_processor(profile_name)

    def planned_video_pixels(videos: Any, profile: Any) -> tuple[Any, Any]:
        pixels, grids = [], []
        for v in videos:
            size = (v["utils_height"], v["utils_width"])
            frames = qwen_vl_utils_resize(sampled_frames(v, size, profile.video.family()), size)
            out = processor(videos=[frames], do_sample_frames=False, return_tensors="pt",
                            do_resize=profile.video.family().processor_resize, **call)
            pixels.append(out["pixel_values_videos"])
            grids.append(out["video_grid_thw"])
        return torch.cat(pixels), torch.cat(grids)

    return planned_video_pixels, mp


def gemma4_video_processor() -> Any:
    """Gemma4VideoProcessor (torchvision's calls in torch: ``tests.helpers``) with the released
    processor_config.json's video_processor values (32 frames of 70 soft tokens), the class's defaults else."""
    from tests.helpers import gemma4_video_processor_class

    values = nested(file_values(entry_of("gemma4"), "processor_config.json"))["video_processor"]
    return gemma4_video_processor_class()(**values)


def _reference_gemma4_video_pixels() -> Callable[..., dict[str, Any]]:
    """Gemma 4's ``video_pixel_values`` through the released video processor: each stored video's whole clip with
    its metadata and the planned frame count, the processor sampling the frames itself, as Gemma4Processor runs."""
    import torch
    from transformers.video_utils import VideoMetadata

    from packer.media.video import decode_frames, probe

    processor = gemma4_video_processor()

    def video_pixel_values(self: Any, videos: list[dict[str, Any]]) -> dict[str, Any]:
        parts, counts = [], []
        for v in videos:
            info = probe(v["source"])
            meta = VideoMetadata(total_num_frames=info.num_frames, fps=info.fps, width=info.width,
                                 height=info.height, duration=info.num_frames / info.fps)
            counts.append(len(v["frame_indices"]))
            parts.append(processor(videos=[decode_frames(info.path, range(info.num_frames))], video_metadata=[meta],
                                   num_frames=counts[-1], return_tensors="pt"))
        return {"pixel_values_videos": torch.cat([p["pixel_values_videos"] for p in parts]),
                "video_position_ids": torch.cat([p["video_position_ids"] for p in parts]),
                "num_frames_per_video": torch.tensor(counts, dtype=torch.int64)}

    return video_pixel_values


def _reference_molmo2_video_pixels() -> Callable[..., dict[str, Any]]:
    """Molmo2's ``video_pixel_values`` through Molmo2VideoProcessor (its torchvision calls in torch:
    ``packer.models.molmo2.processor``) built from the fixture's values (crop size, frames, fps; the class's
    defaults for patch and pooling), not the profile's: the planned frames, ``do_sample_frames=False``."""
    import torch

    from packer.media.video import decode_frames
    from packer.models.molmo2.processor import video_processor_class

    values = file_values(entry_of("molmo2"), P)
    processor = video_processor_class()(size={"height": values["crop_px"], "width": values["crop_px"]},
                                        num_frames=values["video_num_frames"], max_fps=values["video_max_fps"])

    def video_pixel_values(self: Any, videos: list[dict[str, Any]]) -> dict[str, Any]:
        clips = [torch.from_numpy(decode_frames(v["source"], list(v["frame_indices"]))) for v in videos]
        out = processor(videos=clips, do_sample_frames=False, input_data_format="channels_last", return_tensors="pt")
        return {k: out[k] for k in ("pixel_values_videos", "video_token_pooling", "video_grids")}

    return video_pixel_values


@contextmanager
def released_reader(profile: Any, **image_kwargs: Any) -> Iterator[None]:
    """Within it, ``profile``'s reader runs the released processors, not ones made from the profile: its image
    processor is ``image_processor(profile.name, **image_kwargs)`` (``image_kwargs``: the build's own settings,
    e.g. ``max_pixels``), its audio features are the released extractor's (``audio_extractor``), and a Qwen
    family's videos go through its released video processor (``qwen_video_processor``), Gemma 4's and Molmo2's
    through theirs (GLM's video pixels stay the reader's: no released video file is recorded for it). The proofs
    (packed == unpacked) read their batches inside it, so a profile default that drifts from the released file
    counts other tokens than the released processor gives, and the proof fails: the model refuses features and
    placeholders that disagree, or the audio check does (``tests/models/test_released_proofs.py`` shows both)."""
    import pytest

    from packer.models import reader as base

    cls = type(profile.reader())
    with pytest.MonkeyPatch.context() as mp:
        if profile.image is not None:
            processor = image_processor(profile.name, **image_kwargs)
            mp.setattr(cls, "make_image_processor", lambda self: processor)
        if profile.audio is not None:
            mp.setattr(cls, "audio_features", _reference_audio_features(profile.name))
        undo = None
        if profile.video is not None and family_of(profile.name) == "gemma4":
            mp.setattr(cls, "video_pixel_values", _reference_gemma4_video_pixels())
        if profile.video is not None and family_of(profile.name) == "molmo2":
            mp.setattr(cls, "video_pixel_values", _reference_molmo2_video_pixels())
        if profile.video is not None and profile.name in QWEN_VIDEO:
            pixels, undo = _reference_video_pixels(profile.name)
            mp.setattr(sys.modules[cls.video_pixel_values.__module__], "planned_video_pixels", pixels)
        base._image_processor.cache_clear()
        try:
            yield
        finally:
            base._image_processor.cache_clear()
            if undo is not None:
                undo.undo()
