"""Video, the medium axis: read a clip's (or a frame list's) headers, decode the frames a plan names.

The build needs every video's token count before any pixel is decoded, so ``probe`` reads the container's
metadata only (PyAV) and ``probe_frame_list`` the frame images' headers; a family's rules turn that into a
``VideoPlan`` (which frames, what size, how many tokens: the Qwen family's in
``packer.models.shared.qwen_video_plan``), and the reader later decodes just the planned frames (``decode_frames``,
``decode_frame_list``).

    clip.mp4: 10 s at 30 fps, 640x480 -> probe: VideoInfo(num_frames=300, fps=30.0, width=640, height=480, ...)
    VideoPlan(frame_indices=(0, 16, ..., 299), size=(476, 644), grid_thw=(10, 34, 46), ...)  (qwen2-vl)
    decode_frames("clip.mp4", plan.frame_indices) -> (20, 480, 640, 3) uint8

Frames are numbered in presentation order, as decord numbers them (``frame_ts_`` sorted by pts). Rotation
metadata is not applied (neither decord nor PyAV applies it), so the header size is the decoded size.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from packer.core.location import file_version, is_url, open_file
from packer.errors import RecordError


def _av():
    """PyAV, imported on first use: only builds with videos need it."""
    import av

    return av


# --------------------------------------------------------------------------------------------- probing


@dataclass(frozen=True, kw_only=True)
class VideoInfo:
    """What ``probe`` reads from a video file's container and stream headers (no frame is decoded)."""

    path: str
    """The file probed."""
    width: int
    """Coded frame width in pixels (what a decoder returns; rotation metadata is not applied)."""
    height: int
    """Coded frame height in pixels."""
    num_frames: int
    """Frames in the stream: the header's count (mp4/mov/avi), else the video packets counted by demuxing."""
    fps: float
    """Average frame rate, ``avg_frame_rate`` (frames / duration), what decord's ``get_avg_fps`` returns."""
    duration: float
    """Seconds: the stream's duration, else the container's, else num_frames / fps."""
    time_base: Fraction
    """Seconds per tick of the stream's timestamps."""
    start_time: float
    """Seconds: timestamp of the first frame (0.0 when the header has none)."""
    frames_from: str
    """Where ``num_frames`` came from: "header" or "packets"."""
    codec: str
    """Codec name (h264, vp9, ...)."""


def probe(path: str) -> VideoInfo:
    """Read a video's size, frame count and rate from its headers; RecordError for a file that cannot be used.

    Reasons: ``missing_video`` (no such file), ``bad_video`` (a directory or empty file, not a readable
    container, no video stream, no frames, no frame rate, or an mp4/mov whose boxes run past the end of the
    file, i.e. a truncated download). Nothing is decoded: PyAV (libavformat) reads the headers, and where the
    header has no frame count (Matroska/WebM) the video packets are counted by demuxing, which reads the file
    but decodes nothing (see ``_HEADERS_ONLY`` for the stream probe's own decoding, switched off).
    Measured (scripts/bench_video_probe.py, docs/benchmarks.md): 0.43 ms CPU a clip from mp4 headers, 1.5 ms
    from Matroska (packets counted), against 119 ms to decode a 10 s 360p or 5 s 720p clip to count it.

    A file's answer is cached in the process by (path, inode, size, mtime, ctime): datasets ask many questions
    of one clip. Errors are not cached.
    """
    if is_url(path):  # an input on a store: headers read through ranged GETs, cached by size and ETag
        try:
            size, version = file_version(path)
        except FileNotFoundError as e:
            raise RecordError("missing_video", f"video object {path!r} does not exist; check the path") from e
        if size == 0:
            raise RecordError("bad_video", f"video {path!r} is an empty file")
        return _probe_file(path, 0, size, version, 0)
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        raise RecordError(
            "missing_video", f"video file {path!r} does not exist; check the path or --image-root"
        ) from e
    except OSError as e:
        raise RecordError("bad_video", f"cannot open video {path!r}: {e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise RecordError("bad_video", f"video {path!r} is not a regular file")
    if st.st_size == 0:
        raise RecordError("bad_video", f"video {path!r} is an empty file")
    return _probe_file(path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# libavformat's stream probe (avformat_find_stream_info) decodes 7 H.264 frames (18-20 with deep B-frame
# reordering) to guess the decoder's delay: 4-10 ms a clip at 360p-720p, more at 4K. skip_frame=nonkey (passed to every stream's decoder) lets it
# stop at the headers: 0.3-0.4 ms, with the same size, frame count and rate on every test clip (the tests
# compare with a plain av.open). A stream whose size only a decoded frame reveals is reopened without it.
_HEADERS_ONLY = {"skip_frame": "nonkey"}


@lru_cache(maxsize=8192)  # ~3 MB at most: memory does not grow with the corpus
def _probe_file(path: str, inode: int, size: int, mtime_ns: int | str, ctime_ns: int) -> VideoInfo:
    info = _read_headers(path, size, _HEADERS_ONLY)
    if info.width < 1 or info.height < 1:
        info = _read_headers(path, size, None)
    if info.width < 1 or info.height < 1:
        raise RecordError("bad_video", f"{path}: the video stream has size {info.width}x{info.height}")
    return info


def _read_headers(path: str, size: int, options: dict | None) -> VideoInfo:
    av = _av()
    source = open_file(path, block_size=1 << 20) if is_url(path) else path  # PyAV reads a file object too
    try:
        container = av.open(source, metadata_errors="ignore", options=options)
    except (av.error.FFmpegError, UnicodeDecodeError) as e:
        if source is not path:
            source.close()
        raise RecordError("bad_video", f"{path} is not a readable video container: {e}") from e
    with container, source if source is not path else contextlib.nullcontext():
        stream = _video_stream(container)
        if stream is None:
            kinds = ", ".join(
                f"{s.type} {s.codec_context.name}" + (" (cover image)" if _is_cover(s) else "") for s in container.streams
            )
            raise RecordError("bad_video", f"{path} has no video stream (streams: {kinds or 'none'})")
        if "mp4" in container.format.name or "mov" in container.format.name:
            truncated = _isobmff_truncation(path, size)
            if truncated:
                raise RecordError("bad_video", f"{path} is truncated: {truncated}")
        width, height = stream.codec_context.width, stream.codec_context.height
        rate = stream.average_rate
        if stream.frames > 0:
            num_frames, frames_from = stream.frames, "header"
        else:
            num_frames, frames_from = _count_packets(container, stream, path), "packets"
        time_base = stream.time_base or Fraction(1, 1)
        if stream.duration:
            duration = float(stream.duration * time_base)
        elif container.duration:
            duration = container.duration / av.time_base
        else:
            duration = num_frames / float(rate) if rate else 0.0
        start_time = float(stream.start_time * time_base) if stream.start_time is not None else 0.0
        codec = stream.codec_context.name
    if num_frames < 1:
        raise RecordError("bad_video", f"{path} has a video stream with no frames")
    if not rate or rate <= 0:
        # decord's get_avg_fps would return 0/0 here and qwen-vl-utils cannot sample by time without a rate.
        raise RecordError("bad_video", f"{path}: the video stream has no average frame rate in its header")
    return VideoInfo(
        path=path, width=width, height=height, num_frames=num_frames, fps=float(rate), duration=duration,
        time_base=time_base, start_time=start_time, frames_from=frames_from, codec=codec,
    )


def _is_cover(stream) -> bool:
    return bool(stream.disposition & _av().stream.Disposition.attached_pic)


def _video_stream(container):
    """The clip's video stream, as av_find_best_stream picks it (decord and torchcodec do), or None. A cover
    image (an ``attached_pic`` stream: an mp3's or m4a's album art) is not a video."""
    stream = container.streams.best("video")
    if stream is not None and _is_cover(stream):
        stream = next((s for s in container.streams.video if not _is_cover(s)), None)
    return stream


def _count_packets(container, stream, path: str) -> int:
    """Video packets in the file, by demuxing (no decoding): decord's frame count for such containers."""
    av = _av()
    try:
        return sum(1 for packet in container.demux(stream) if packet.size > 0)  # the last packet is an empty flush
    except av.error.FFmpegError as e:
        raise RecordError("bad_video", f"{path}: the container is corrupt ({e})") from e


def _isobmff_truncation(path: str, size: int) -> str | None:
    """Why an mp4/mov file is cut short, or None: a top-level box (moov, mdat, moof...) ends past the file's end.

    The header of a "faststart" mp4 (moov first) still lists every frame when the media data after it was cut
    off, so the box sizes are the cheap check (a few 8-byte reads), like a JPEG's end-of-image marker. A file
    cut before its moov box (moov last) does not open at all.
    """
    with open_file(path, block_size=1 << 16) as f:
        offset = 0
        while offset + 8 <= size:
            f.seek(offset)
            header = f.read(16)
            box_size, kind = struct.unpack(">I4s", header[:8])
            if box_size == 1 and len(header) == 16:  # 64-bit size follows the type
                box_size = struct.unpack(">Q", header[8:16])[0]
            elif box_size == 0:  # the box runs to the end of the file
                return None
            name = kind.decode("latin-1")
            if box_size < 8:
                return f"box {name!r} at byte {offset} has size {box_size}"
            if offset + box_size > size:
                return f"box {name!r} at byte {offset} needs {offset + box_size} bytes, the file has {size}"
            offset += box_size
    return None


# ---------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True, kw_only=True)
class VideoPlan:
    """Everything the build needs about one video, and what the reader needs to make its pixels."""

    frame_indices: tuple[int, ...]
    """Frames to decode, in order: indices into the clip (presentation order), or into a padded frame list."""
    video_fps: float
    """The clip's average rate (a frame list: raw_fps); the HF ``VideoMetadata.fps``."""
    total_frames: float
    """Frames in the sampled range (``VideoMetadata.total_num_frames``); a frame list: n / sample_fps * raw_fps."""
    sample_fps: float
    """Sampled frames per second of the clip: nframes / total_frames * video_fps (a frame list: sample_fps)."""
    utils_size: tuple[int, int]
    """(height, width) qwen-vl-utils resizes the frames to (bicubic, antialiased)."""
    size: tuple[int, int]
    """(height, width) the frames have in the vision tower, after the HF processor's resize (if any)."""
    grid_thw: tuple[int, int, int]
    """``video_grid_thw``: (frames / temporal patch, height / patch, width / patch)."""
    num_tokens: int
    """``<|video_pad|>`` tokens: t * h * w // merge_size**2."""
    second_per_grid_t: float
    """Seconds per temporal patch, temporal_patch_size / sample_fps (Qwen2.5-VL's ``second_per_grid_ts``)."""
    timestamps: tuple[float, ...] | None
    """Qwen3-VL: the seconds printed before each temporal patch's tokens; None for other families."""

    @property
    def tokens_per_frame(self) -> int:
        """Tokens per temporal patch: h * w // merge_size**2 (merge 2 for every Qwen family)."""
        return self.num_tokens // self.grid_thw[0]


def probe_frame_list(paths: Sequence[str]) -> list[tuple[int, int]]:
    """(width, height) of each frame image, from its header; RecordError missing_image / bad_image / bad_video."""
    from PIL import Image, UnidentifiedImageError

    if not paths:
        raise RecordError("bad_video", "the video's frame list is empty")
    sizes = []
    for path in paths:
        try:
            with open_file(path, block_size=1 << 16) as f, Image.open(f) as im:  # a path or an input URL
                sizes.append(im.size)
        except FileNotFoundError as e:
            raise RecordError("missing_image", f"frame image {path!r} does not exist; check the path or --image-root") from e
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
            raise RecordError("bad_image", f"frame {path} is not a readable image: {e}") from e
    return sizes


# -------------------------------------------------------------------------------------------- decoding


def decode_frames(path: str, indices: Sequence[int]) -> np.ndarray:
    """The clip's frames at ``indices`` (presentation order, as decord numbers them), RGB. uint8 (T, H, W, 3).

    Decodes only what is needed: the packets are demuxed once (no decoding) for each frame's timestamp and the
    keyframes; then for each wanted frame in ascending order the decoder seeks to the keyframe before it when
    that keyframe is past the current position, else keeps decoding forward. Indices may repeat and come in
    any order. RecordError("bad_video") for a frame that is not in the clip or does not decode.
    """
    want = [int(i) for i in indices]
    if not want:
        raise ValueError("decode_frames needs at least one index")
    av = _av()
    try:
        with av.open(path, metadata_errors="ignore") as container:
            stream = _video_stream(container)
            if stream is None:
                raise RecordError("bad_video", f"{path} has no video stream")
            frames = _decode_wanted(container, stream, sorted(set(want)), path)
    except FileNotFoundError as e:
        raise RecordError("missing_video", f"video file {path!r} does not exist") from e
    except av.error.FFmpegError as e:
        raise RecordError("bad_video", f"{path}: cannot decode the video: {e}") from e
    return np.stack([frames[i] for i in want])  # (T, H, W, 3)


def _decode_wanted(container, stream, wanted: list[int], path: str) -> dict[int, np.ndarray]:
    packets = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.size > 0]
    if not packets or any(pts is None for pts, _ in packets):
        return _decode_in_order(container, stream, wanted, path)
    order = sorted(pts for pts, _ in packets)  # frame i has the i-th smallest timestamp
    if wanted[-1] >= len(order) or wanted[0] < 0:
        raise RecordError("bad_video", f"{path}: frame {wanted[-1] if wanted[0] >= 0 else wanted[0]} asked, the clip has {len(order)}")
    keyframes = sorted(pts for pts, key in packets if key) or order[:1]
    pts_to_index = {order[i]: i for i in wanted}
    out: dict[int, np.ndarray] = {}
    decoded = None  # frames of the current decoding run
    position = None  # timestamp of the last frame decoded
    for i in wanted:
        target = order[i]
        if i in out:
            continue
        keyframe = keyframes[max(0, bisect.bisect_right(keyframes, target) - 1)]
        if decoded is None or position is None or target <= position or keyframe > position:
            container.seek(keyframe, stream=stream, backward=True, any_frame=False)  # also flushes the decoder
            decoded, position = container.decode(stream), None
        for frame in decoded:
            if frame.pts is None:
                continue
            position = frame.pts
            j = pts_to_index.get(frame.pts)
            if j is not None and j not in out:
                out[j] = frame.to_ndarray(format="rgb24")
            if frame.pts >= target:
                break
        if i not in out:  # a timestamp the decoder never produced (seek landed after it, a broken GOP)
            return _decode_in_order(container, stream, wanted, path)
    return out


def _decode_in_order(container, stream, wanted: list[int], path: str) -> dict[int, np.ndarray]:
    """Fallback without usable timestamps: decode from the start, counting frames, up to the last one wanted."""
    container.seek(0)
    targets, out, count = set(wanted), {}, 0
    for frame in container.decode(stream):
        if count in targets:
            out[count] = frame.to_ndarray(format="rgb24")
            if len(out) == len(targets):
                return out
        count += 1
    missing = sorted(targets - set(out))
    raise RecordError("bad_video", f"{path}: frames {missing[:5]} are not in the clip ({count} frames decode)")


def decode_frame_list(paths: Sequence[str]) -> list[np.ndarray]:
    """Each frame image decoded to RGB as qwen-vl-utils' ``to_rgb`` does (vision_process.py:84-90): RGBA over
    white, anything else ``convert("RGB")``. uint8 (H, W, 3) each; sizes may differ before the plan's resize."""
    from PIL import Image, UnidentifiedImageError

    frames = []
    for path in paths:
        try:
            with Image.open(path) as im:
                if im.mode == "RGBA":
                    rgb = Image.new("RGB", im.size, (255, 255, 255))
                    rgb.paste(im, mask=im.split()[3])
                else:
                    rgb = im.convert("RGB")
        except FileNotFoundError as e:
            raise RecordError("missing_image", f"frame image {path!r} does not exist") from e
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as e:
            raise RecordError("bad_image", f"cannot decode frame image {path}: {e}") from e
        frames.append(np.asarray(rgb))
    return frames


