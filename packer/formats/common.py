"""What every input kind shares: the record context (``Ctx``), image references, message parts, roles, the
per-message loss flag, message lists and tree branches.

An input kind (``chat.py``, ``llava.py``, ``text.py``) is a function ``parse(obj, ctx) -> Example`` built from
these; each raises ``ctx.error(reason, message)`` for a bad record, so every reject carries ``path:line``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import re
from typing import Any

from packer.core.location import is_file, resolve
from packer.core.types import AudioRef, Example, ImageRef, Message, Node, Part, VideoRef
from packer.errors import RecordError

# LLaMA-Factory v1's content parts hold their payload under "value": the type -> the key packer reads it from.
_VALUE_KEYS = {"text": "text", "image_url": "image_url", "video_url": "video_url", "audio_url": "audio_url",
               "image": "image", "video": "video", "audio": "audio"}
# Accepted roles -> canonical role. LLaVA / ShareGPT names map onto the chat roles.
ROLES: dict[str, str] = {
    "system": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "human": "user",
    "gpt": "assistant",
}
IMAGE_PLACEHOLDER = "<image>"  # LLaVA's placeholder for "the next image goes here"
VIDEO_PLACEHOLDER = "<video>"  # and for the next video (LLaMA-Factory, LLaVA-Video)
AUDIO_PLACEHOLDER = "<audio>"  # and for the next audio clip (LLaMA-Factory, ms-swift)
AUDIO_OPTIONS = ("audio_start", "audio_end")  # an audio part's window, seconds (qwen-omni-utils' names)
# A video part's sampling options, named as qwen-vl-utils names them (packer.models.shared.qwen_video_plan.VideoRequest reads
# them; tests/formats/test_formats.py checks the two lists agree).
VIDEO_OPTIONS = (
    "fps", "nframes", "min_frames", "max_frames", "video_start", "video_end", "min_pixels", "max_pixels",
    "total_pixels", "resized_height", "resized_width", "sample_fps", "raw_fps",
)


class Ctx:
    """What resolving a record needs: where it is, where relative paths point, the pool of top-level images."""

    __slots__ = ("path", "line", "root_dir", "source_name", "pool", "used", "video_pool", "videos_used",
                 "audio_pool", "audios_used", "audio_in_video")

    def __init__(self, path: str, line: int, root_dir: str, source_name: str = "", audio_in_video: bool = False):
        self.path = path
        self.line = line
        self.root_dir = root_dir
        self.source_name = source_name
        self.pool: list[ImageRef] | None = None  # top-level images consumed by placeholders; None: the record has none
        self.used = 0
        self.video_pool: list[VideoRef] | None = None  # top-level videos, the same way
        self.videos_used = 0
        self.audio_pool: list[AudioRef] | None = None  # top-level audio clips, the same way
        self.audios_used = 0
        self.audio_in_video = audio_in_video  # every clip video's sound track too (use_audio_in_video)

    def error(self, reason: str, message: str) -> RecordError:
        return RecordError(reason, message, path=self.path, line=self.line)

    def example(self, root: Node, kind: str, *, text: str | None = None, tools: list[dict] | None = None) -> Example:
        return Example(
            root=root, kind=kind, path=self.path, line=self.line, source_name=self.source_name, text=text, tools=tools
        )

    def next_pooled(self) -> ImageRef:
        if self.pool is None or self.used >= len(self.pool):
            n = 0 if self.pool is None else len(self.pool)
            raise self.error(
                "image_count_mismatch",
                f"more image placeholders than images (the record lists {n}); "
                "give each placeholder an image or remove the extra placeholders",
            )
        ref = self.pool[self.used]
        self.used += 1
        return ref

    def next_pooled_video(self) -> VideoRef:
        if self.video_pool is None or self.videos_used >= len(self.video_pool):
            n = 0 if self.video_pool is None else len(self.video_pool)
            raise self.error(
                "image_count_mismatch",
                f"more video placeholders than videos (the record lists {n}); "
                "give each <video> placeholder (or source-less video part) a video",
            )
        ref = self.video_pool[self.videos_used]
        self.videos_used += 1
        return ref

    def next_pooled_audio(self) -> AudioRef:
        if self.audio_pool is None or self.audios_used >= len(self.audio_pool):
            n = 0 if self.audio_pool is None else len(self.audio_pool)
            raise self.error(
                "image_count_mismatch",
                f"more audio placeholders than audio clips (the record lists {n}); "
                "give each <audio> placeholder (or source-less audio part) a clip",
            )
        ref = self.audio_pool[self.audios_used]
        self.audios_used += 1
        return ref


def image_ref(source: Any, ctx: Ctx) -> ImageRef:
    """A path, a ``data:`` URL, raw bytes or a ``{"bytes", "path"}`` struct (``datasets.Image``) -> ImageRef
    (a path resolved and checked to exist; bytes kept as they are, never re-encoded; bytes win over path)."""
    if isinstance(source, dict) and ("bytes" in source or "path" in source):
        data, path = source.get("bytes"), source.get("path")
        if data is None:
            return image_ref(path, ctx)
        source = data
    if isinstance(source, (bytes, bytearray, memoryview)):
        if not source:
            raise ctx.error("bad_image", "embedded image bytes are empty")
        return ImageRef(data=bytes(source))
    if not isinstance(source, str) or not source:
        raise ctx.error(
            "wrong_type", "an image source must be a non-empty string (path or data URL), bytes or a "
            f'{{"bytes", "path"}} struct, got {source!r:.80}'
        )
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ctx.error(
                "bad_image",
                f"inline image {header[:40]!r}... is not a base64 data URL (data:image/...;base64,...)",
            )
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ctx.error("bad_image", f"inline image is not valid base64: {e}") from None
        if not data:
            raise ctx.error("bad_image", "inline image is empty")
        return ImageRef(data=data)
    if source.startswith(("http://", "https://")):
        raise ctx.error(
            "missing_image", f"{source!r} is a URL; packer works offline: download the images and use paths"
        )
    if source.startswith("file://"):
        source = source[len("file://") :]
    path = resolve(source, ctx.root_dir)  # an input on a store: its prefix (s3://...), not this node's disk
    if os.path.isdir(path):  # a URL is never a local directory; a store has no directories
        raise ctx.error("bad_image", f"image {path} is a directory, not an image file (named {source!r})")
    if not is_file(path):
        raise ctx.error(
            "missing_image",
            f"image {path} does not exist (named {source!r}; set --image-root if paths are relative to another directory)",
        )
    return ImageRef(path=path)


def _file_path(source: str, ctx: Ctx, *, missing: str, bad: str, what: str) -> str:
    """A file path named by a record, resolved against the record's root and checked to be a file."""
    if source.startswith(("http://", "https://")):
        raise ctx.error(missing, f"{source!r} is a URL; packer works offline: download the {what}s and use paths")
    if source.startswith("file://"):
        source = source[len("file://") :]
    path = resolve(source, ctx.root_dir)
    if os.path.isdir(path):  # a URL is never a local directory; a store has no directories
        raise ctx.error(bad, f"{what} {path} is a directory, not a file (named {source!r})")
    if not is_file(path):
        raise ctx.error(
            missing,
            f"{what} {path} does not exist (named {source!r}; set --image-root if paths are relative to another directory)",
        )
    return path


def video_ref(source: Any, ctx: Ctx, options: dict[str, Any] | None = None) -> VideoRef:
    """A clip path, or a list of frame image paths, plus the part's sampling options -> VideoRef.

        video_ref("clip.mp4", ctx, {"type": "video", "fps": 1})  ->  VideoRef(path=".../clip.mp4", options=(("fps", 1),))

    Options are checked to be numbers here; what they mean for the clip (a window past its end, ...) is
    checked when the clip's header is read (``packer.media.video``), with the same ``path:line``.
    """
    kept = []
    for name in VIDEO_OPTIONS:
        value = (options or {}).get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ctx.error("wrong_type", f"video option {name!r} must be a number, got {value!r:.80}")
        kept.append((name, value))
    if isinstance(source, str) and source:
        if source.startswith("data:"):
            raise ctx.error("bad_video", "inline (data: URL) videos are not supported; give a file path")
        return VideoRef(path=_file_path(source, ctx, missing="missing_video", bad="bad_video", what="video"),
                        options=tuple(kept))
    if isinstance(source, list) and source and all(isinstance(f, str) and f for f in source):
        frames = tuple(_file_path(f, ctx, missing="missing_image", bad="bad_image", what="frame image") for f in source)
        return VideoRef(frames=frames, options=tuple(kept))
    if isinstance(source, list) and not source:
        raise ctx.error("bad_video", "the video's frame list is empty")
    raise ctx.error(
        "wrong_type", f"a video source must be a file path or a list of frame image paths, got {source!r:.80}"
    )


def audio_ref(source: Any, ctx: Ctx, options: dict[str, Any] | None = None) -> AudioRef:
    """A clip path, a ``data:`` URL, raw bytes or a ``{"bytes", "path"}`` struct (``datasets.Audio``), plus the
    part's window (``audio_start`` / ``audio_end``, seconds) -> AudioRef (a path resolved and checked to exist;
    bytes kept as they are; bytes win over path).

        audio_ref("a.wav", ctx, {"audio_start": 1.5})  ->  AudioRef(path=".../a.wav", start=1.5)

    What the window means for the clip (past its end, ...) is checked when its header is read
    (``packer.media.audio``), with the same ``path:line``.
    """
    start, end = (_seconds(ctx, name, (options or {}).get(name)) for name in AUDIO_OPTIONS)
    if start is not None and end is not None and end <= start:
        raise ctx.error("bad_audio", f"audio_end {end} s is not after audio_start {start} s")
    if isinstance(source, dict) and ("bytes" in source or "path" in source):
        data, path = source.get("bytes"), source.get("path")
        source = path if data is None else data
    if isinstance(source, (bytes, bytearray, memoryview)):
        if not source:
            raise ctx.error("bad_audio", "embedded audio bytes are empty")
        return AudioRef(data=bytes(source), start=start, end=end)
    if not isinstance(source, str) or not source:
        raise ctx.error(
            "wrong_type", "an audio source must be a non-empty string (path or data URL), bytes or a "
            f'{{"bytes", "path"}} struct, got {source!r:.80}'
        )
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ctx.error("bad_audio", f"inline audio {header[:40]!r}... is not a base64 data URL (data:audio/...;base64,...)")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ctx.error("bad_audio", f"inline audio is not valid base64: {e}") from None
        if not data:
            raise ctx.error("bad_audio", "inline audio is empty")
        return AudioRef(data=data, start=start, end=end)
    return AudioRef(path=_file_path(source, ctx, missing="missing_audio", bad="bad_audio", what="audio"), start=start,
                    end=end)


def _seconds(ctx: Ctx, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ctx.error("wrong_type", f"audio option {name!r} must be a number of seconds, got {value!r:.80}")
    if value < 0:
        raise ctx.error("bad_audio", f"audio option {name!r} is negative ({value} s)")
    return float(value)


def _input_audio(value: Any, ctx: Ctx, where: str) -> AudioRef:
    """OpenAI's ``{"type": "input_audio", "input_audio": {"data": base64, "format": "wav"}}``."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        raise ctx.error("wrong_type", f'{where}: \'input_audio\' must be {{"data": base64, "format": ...}}')
    try:
        data = base64.b64decode(value["data"], validate=True)
    except (binascii.Error, ValueError) as e:
        raise ctx.error("bad_audio", f"{where}: input_audio data is not valid base64: {e}") from None
    if not data:
        raise ctx.error("bad_audio", f"{where}: input_audio data is empty")
    return AudioRef(data=data)


def sound_track(video: VideoRef, ctx: Ctx) -> AudioRef:
    """A clip video's own sound track (``use_audio_in_video``), over the video's window."""
    if video.frames:
        raise ctx.error("bad_audio", f"use_audio_in_video: a video given as {len(video.frames)} frame images "
                                         "has no sound track; give the clip, or turn the option off for this record")
    options = dict(video.options)
    start, end = options.get("video_start"), options.get("video_end")
    return AudioRef(path=video.path, start=None if start is None else float(start),
                    end=None if end is None else float(end), video=True)


def _split_placeholders(text: str, ctx: Ctx, parts: list[Part]) -> None:
    """Append ``text`` to ``parts``, each ``<image>`` (``<video>``, ``<audio>``) replaced by the next pooled image
    (video, clip) where the record has such a pool."""
    names = [p for p, pool in ((IMAGE_PLACEHOLDER, ctx.pool), (VIDEO_PLACEHOLDER, ctx.video_pool),
                               (AUDIO_PLACEHOLDER, ctx.audio_pool)) if pool is not None]
    for piece in re.split("(" + "|".join(names) + ")", text) if names else [text]:
        if piece == IMAGE_PLACEHOLDER and ctx.pool is not None:
            parts.append(ctx.next_pooled())
        elif piece == VIDEO_PLACEHOLDER and ctx.video_pool is not None:
            parts.append(ctx.next_pooled_video())
        elif piece == AUDIO_PLACEHOLDER and ctx.audio_pool is not None:
            parts.append(ctx.next_pooled_audio())
        elif piece:
            parts.append(piece)


def content_parts(content: Any, ctx: Ctx, where: str) -> list[Part]:
    """A message's content (string or list of parts) -> text strings and media references in order; with
    ``use_audio_in_video``, each clip video followed by its sound track."""
    parts: list[Part] = []
    pooled = ctx.pool is not None or ctx.video_pool is not None or ctx.audio_pool is not None
    if isinstance(content, str):
        if pooled:
            _split_placeholders(content, ctx, parts)
        elif content:
            parts.append(content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise ctx.error(
                    "wrong_type",
                    f'{where} part {j} must be an object like {{"type": "text", ...}}, got {type(part).__name__}',
                )
            kind = part.get("type")
            if "value" in part and kind in _VALUE_KEYS:  # LLaMA-Factory v1: {"type": "image_url", "value": "a.jpg"}
                part = {**{k: v for k, v in part.items() if k != "value"}, _VALUE_KEYS[kind]: part["value"]}
            if kind == "text" or (kind is None and "text" in part):
                text = part.get("text")
                if not isinstance(text, str):
                    raise ctx.error(
                        "wrong_type", f"{where} part {j}: 'text' must be a string, got {type(text).__name__}"
                    )
                if pooled:
                    _split_placeholders(text, ctx, parts)
                elif text:
                    parts.append(text)
            elif kind == "image" or (kind is None and "image" in part):
                source = part.get("image")
                parts.append(ctx.next_pooled() if source is None else image_ref(source, ctx))
            elif kind == "image_url" or (kind is None and "image_url" in part):
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                parts.append(image_ref(url, ctx))
            elif kind == "video_url":
                url = part.get("video_url")
                parts.append(video_ref(url.get("url") if isinstance(url, dict) else url, ctx, part))
            elif kind == "video" or (kind is None and "video" in part):
                source = part.get("video")
                parts.append(ctx.next_pooled_video() if source is None else video_ref(source, ctx, part))
            elif kind == "audio" or (kind is None and "audio" in part):
                source = part.get("audio")
                if source is None:
                    if any(part.get(o) is not None for o in AUDIO_OPTIONS):
                        raise ctx.error("wrong_type", f"{where} part {j}: a window needs the clip in the part; "
                                                      "a pooled clip (<audio>) takes no options")
                    parts.append(ctx.next_pooled_audio())
                else:
                    parts.append(audio_ref(source, ctx, part))
            elif kind == "audio_url" or (kind is None and "audio_url" in part):
                url = part.get("audio_url")
                parts.append(audio_ref(url.get("url") if isinstance(url, dict) else url, ctx, part))
            elif kind == "input_audio":
                parts.append(_input_audio(part.get("input_audio"), ctx, f"{where} part {j}"))
            else:
                raise ctx.error(
                    "wrong_type",
                    f"{where} part {j} has unsupported type {kind!r}; use text, image, image_url, video or audio "
                    "(or video_url, audio_url; a tool call goes in the message's tool_calls)",
                )
    else:
        raise ctx.error(
            "wrong_type", f"{where} content must be a string or a list of parts, got {type(content).__name__}"
        )
    if not parts:
        raise ctx.error("empty_messages", f"{where} has no content")
    if ctx.audio_in_video and any(isinstance(p, VideoRef) for p in parts):
        parts = [q for p in parts for q in ((p, sound_track(p, ctx)) if isinstance(p, VideoRef) else (p,))]
    return parts


def loss_flag(msg: dict[str, Any], ctx: Ctx, where: str) -> bool | float | None:
    """A message's ``loss``: true or false, or a weight (a finite number >= 0) its loss tokens carry, as ms-swift's
    ``loss_scale`` and LLaMA-Factory's ``loss_weights``; a weight of 0 is ``false``. LLaMA-Factory v1's
    per-message ``loss_weight`` is the same weight (1.0: the turn carries loss, weighing 1); OpenAI's ``weight``
    (0 or 1) is ``false`` / ``true``."""
    loss = msg.get("loss")
    if loss is None and msg.get("loss_weight") is None and msg.get("weight") is not None:
        # OpenAI's fine-tuning format: an assistant message's ``weight`` is 0 (not trained on) or 1.
        weight = msg["weight"]
        if isinstance(weight, bool) or weight not in (0, 1):
            raise ctx.error("wrong_type", f"{where} 'weight' (OpenAI's fine-tuning format) must be 0 or 1, got "
                                          f"{weight!r:.80}; a loss weight is 'loss' (a number >= 0)")
        return weight == 1
    if loss is None and msg.get("loss_weight") is not None:
        loss = msg["loss_weight"]
        if isinstance(loss, (int, float)) and not isinstance(loss, bool) and loss == 1:
            loss = True  # a weight of one is plain loss: no loss_weights column for it
    if loss is None or isinstance(loss, bool):
        return loss
    if not isinstance(loss, (int, float)):
        raise ctx.error("wrong_type", f"{where} 'loss' must be true, false or a weight >= 0, got {loss!r}")
    if not math.isfinite(loss) or loss < 0:
        raise ctx.error("wrong_type", f"{where} 'loss' weight must be a finite number >= 0, got {loss!r}")
    return float(loss) if loss > 0 else False


def canonical_role(role: Any, ctx: Ctx, where: str) -> str:
    if not isinstance(role, str):
        raise ctx.error("wrong_type", f"{where} role must be a string, got {type(role).__name__}")
    canonical = ROLES.get(role)
    if canonical is None:
        raise ctx.error(
            "unknown_role", f"{where} role {role!r} is not one of system/user/assistant/tool (or human/gpt)"
        )
    return canonical


def tool_calls(msg: dict[str, Any], role: str, ctx: Ctx, where: str) -> list[dict] | None:
    """An assistant's ``tool_calls`` (OpenAI style: ``{"type": "function", "function": {"name": ...,
    "arguments": {...}}}``, or the bare ``{"name", "arguments"}``), checked and kept as given for the
    template; None when the message has none."""
    calls = msg.get("tool_calls")
    if calls is None or calls == []:
        return None
    if role != "assistant":
        raise ctx.error("wrong_type", f"{where} has 'tool_calls' but role {role!r}; only assistant turns call tools")
    if not isinstance(calls, list):
        raise ctx.error("wrong_type", f"{where} 'tool_calls' must be a list, got {type(calls).__name__}")
    for j, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ctx.error(
                "wrong_type",
                f'{where} tool_calls[{j}] must be {{"function": {{"name": "...", "arguments": {{...}}}}}}, got {call!r}'[:300],
            )
    return calls


def _optional_str(msg: dict[str, Any], key: str, ctx: Ctx, where: str) -> str | None:
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise ctx.error("wrong_type", f"{where} '{key}' must be a string, got {type(value).__name__}")
    return value


def chat_messages(items: Any, ctx: Ctx, where: str) -> list[Message]:
    """A ``messages`` list (``role`` + ``content``; an assistant's ``tool_calls``; a tool result's
    ``tool_call_id`` and ``name``) -> Messages, each through ``chat_message``. An assistant turn with calls may
    have no content."""
    if not isinstance(items, list):
        raise ctx.error("wrong_type", f"{where} must be a list of messages, got {type(items).__name__}")
    return [chat_message(msg, ctx, f"{where}[{i}]") for i, msg in enumerate(items)]


def chat_message(msg: Any, ctx: Ctx, where: str) -> Message:
    """One message of a ``messages`` list, every field checked."""
    if not isinstance(msg, dict):
        raise ctx.error(
            "wrong_type", f"{where} must be an object with 'role' and 'content', got {type(msg).__name__}"
        )
    role = canonical_role(msg.get("role"), ctx, where)
    content = msg.get("content")
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_call" for p in content):
        msg = _v1_tool_calls(msg, content, ctx, where)
        content = msg["content"]
    calls = tool_calls(msg, role, ctx, where)
    if calls is not None and content in (None, "", []):
        parts: list[Part] = []  # a turn that only calls tools
    elif "content" not in msg:
        raise ctx.error("empty_messages", f"{where} has no 'content'")
    else:
        parts = content_parts(content, ctx, where)
    return Message(
        role=role,
        parts=parts,
        loss=loss_flag(msg, ctx, where),
        tool_calls=calls,
        tool_call_id=_optional_str(msg, "tool_call_id", ctx, where),
        name=_optional_str(msg, "name", ctx, where),
    )


def _v1_tool_calls(msg: dict[str, Any], content: list, ctx: Ctx, where: str) -> dict[str, Any]:
    """LLaMA-Factory v1's ``{"type": "tool_call", "value": "{\"name\": ..., \"arguments\": ...}"}`` parts ->
    the message's ``tool_calls`` (OpenAI style), the other parts left as its content."""
    calls = list(msg.get("tool_calls") or [])
    rest = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "tool_call"):
            rest.append(part)
            continue
        value = part.get("value")
        try:
            call = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError as e:
            raise ctx.error("wrong_type", f"{where} part {j} (tool_call) is not JSON: {e.msg}") from None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]):
            raise ctx.error("wrong_type", f'{where} part {j} (tool_call) must be {{"name": ..., "arguments": ...}}')
        calls.append({"type": "function", "function": {"name": call["name"], "arguments": call.get("arguments", {})}})
    return {**msg, "content": rest, "tool_calls": calls}


def record_tools(obj: dict[str, Any], ctx: Ctx) -> list[dict] | None:
    """The record-level ``tools`` list (function definitions, JSON schema), kept as given for the template; a
    JSON string of it (LLaMA-Factory's form) is read, and bare function schemas wrapped as
    ``{"type": "function", "function": ...}``."""
    tools = obj.get("tools")
    if tools is None or tools == [] or tools == "":
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ctx.error("wrong_type", f"'tools' must be a list of tool definitions (or a JSON string of one), "
                                          f"got a string that is not JSON: {e.msg} at column {e.colno}") from None
        if tools == []:
            return None
        if isinstance(tools, list):
            tools = [t if not isinstance(t, dict) or t.get("type") == "function" else {"type": "function", "function": t}
                     for t in tools]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ctx.error("wrong_type", "'tools' must be a list of tool definitions (JSON objects)")
    return tools


def _branch(obj: Any, ctx: Ctx, where: str) -> Node:
    """One tree branch: a list of messages, or ``{"messages": [...], "branches": [...]}``."""
    if isinstance(obj, list):
        messages, branches = obj, None
    elif isinstance(obj, dict):
        messages, branches = obj.get("messages", []), obj.get("branches")
    else:
        raise ctx.error(
            "wrong_type",
            f"{where} must be a list of messages or an object with 'messages', got {type(obj).__name__}",
        )
    if isinstance(messages, list) and not messages:
        raise ctx.error(
            "empty_branch", f"{where} has no messages; drop the branch or give it at least one message"
        )
    return Node(
        messages=chat_messages(messages, ctx, f"{where}.messages" if isinstance(obj, dict) else where),
        children=tree_branches(branches, ctx, where),
    )


def tree_branches(obj: Any, ctx: Ctx, where: str) -> list[Node]:
    """A ``branches`` list (None: no branches) -> child nodes, each a list of messages or a subtree."""
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise ctx.error(
            "wrong_type", f"{where}.branches must be a list of branches, got {type(obj).__name__}"
        )
    return [_branch(b, ctx, f"{where}.branches[{i}]") for i, b in enumerate(obj)]


def image_pool(obj: dict[str, Any], ctx: Ctx) -> list[ImageRef] | None:
    """The top-level ``images`` / ``image`` field (str or list), resolved; None when absent."""
    key = "images" if "images" in obj else "image" if "image" in obj else None
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, (str, dict, bytes)):  # one image: a path, a {"bytes", "path"} struct, bytes
        value = [value]
    if not isinstance(value, list):
        raise ctx.error(
            "wrong_type", f"'{key}' must be a path or a list of paths, got {type(value).__name__}"
        )
    return [image_ref(v, ctx) for v in value]


def video_pool(obj: dict[str, Any], ctx: Ctx) -> list[VideoRef] | None:
    """The top-level ``videos`` / ``video`` field, resolved; None when absent. One entry is a clip path or a
    list of frame paths, so ``"video": "clip.mp4"`` is one clip and ``"videos": [["f0.jpg", "f1.jpg"]]`` one
    frame-list video (LLaMA-Factory)."""
    key = "videos" if "videos" in obj else "video" if "video" in obj else None
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ctx.error("wrong_type", f"'{key}' must be a path or a list of videos, got {type(value).__name__}")
    return [video_ref(v, ctx) for v in value]


def audio_pool(obj: dict[str, Any], ctx: Ctx) -> list[AudioRef] | None:
    """The top-level ``audios`` / ``audio`` field (a path, a ``{"bytes", "path"}`` struct, bytes, or a list of
    them), resolved; None when absent (ms-swift / LLaMA-Factory: one ``<audio>`` placeholder per clip)."""
    key = "audios" if "audios" in obj else "audio" if "audio" in obj else None
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if isinstance(value, (str, dict, bytes)):
        value = [value]
    if not isinstance(value, list):
        raise ctx.error("wrong_type", f"'{key}' must be a path or a list of clips, got {type(value).__name__}")
    return [audio_ref(v, ctx) for v in value]


def with_record_system(messages: list[Message], obj: dict[str, Any], ctx: Ctx) -> list[Message]:
    """``messages`` with the record's top-level ``system`` (or ``system_prompt``) string as its first message, as
    ms-swift's MessagesPreprocessor does; a conversation that starts with a different system message of its own
    is refused rather than one of the two silently dropped."""
    key = "system" if "system" in obj else "system_prompt" if "system_prompt" in obj else None
    if key is None or obj[key] is None or obj[key] == "":
        return messages
    system = obj[key]
    if not isinstance(system, str):
        raise ctx.error("wrong_type", f"'{key}' (the system prompt) must be a string, got {type(system).__name__}")
    if messages and messages[0].role == "system":
        if messages[0].parts != [system]:
            raise ctx.error("conflicting_system", f"the record has a top-level '{key}' and a different system "
                                                  "message of its own first; keep one")
        return messages
    return [Message(role="system", parts=[system]), *messages]


def bind_media(obj: dict[str, Any], ctx: Ctx) -> None:
    """The record's top-level image, audio and video pools (and ``use_audio_in_video``) bound to ``ctx``: every
    kind whose messages take ``<image>`` / ``<video>`` / ``<audio>`` placeholders calls this one, so no kind
    leaves a pool unread (a placeholder whose pool was never bound would stay literal text)."""
    ctx.pool = image_pool(obj, ctx)
    ctx.audio_pool = audio_pool(obj, ctx)
    use_audio_in_video(obj, ctx)
    ctx.video_pool = video_pool(obj, ctx)


def use_audio_in_video(obj: dict[str, Any], ctx: Ctx) -> None:
    """The record's ``use_audio_in_video`` (qwen-omni-utils' name) overrides the build's default."""
    value = obj.get("use_audio_in_video")
    if value is None:
        return
    if not isinstance(value, bool):
        raise ctx.error("wrong_type", f"'use_audio_in_video' must be true or false, got {value!r:.80}")
    ctx.audio_in_video = value


def check_pool_used(ctx: Ctx) -> None:
    if ctx.pool is not None and ctx.used != len(ctx.pool):
        raise ctx.error(
            "image_count_mismatch",
            f"the record lists {len(ctx.pool)} images but its messages have {ctx.used} image placeholders; "
            'put one <image> (or {"type": "image"} part) per image',
        )
    if ctx.video_pool is not None and ctx.videos_used != len(ctx.video_pool):
        raise ctx.error(
            "image_count_mismatch",
            f"the record lists {len(ctx.video_pool)} videos but its messages have {ctx.videos_used} video "
            'placeholders; put one <video> (or {"type": "video"} part) per video',
        )
    if ctx.audio_pool is not None and ctx.audios_used != len(ctx.audio_pool):
        raise ctx.error(
            "image_count_mismatch",
            f"the record lists {len(ctx.audio_pool)} audio clips but its messages have {ctx.audios_used} audio "
            'placeholders; put one <audio> (or {"type": "audio"} part) per clip',
        )
