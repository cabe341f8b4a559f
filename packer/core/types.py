"""The canonical in-memory forms of one training example.

``Example``  - what ``formats/`` parses any input line into: a tree of message nodes.
``Encoded``  - what ``encode/encoder.py`` turns an Example into: flat token arrays in depth-first node order.

A plain conversation is a tree with a single node. Nodes are laid out depth-first, parents before
children, so every node is one contiguous span ``[node_offsets[i], node_offsets[i+1])`` of the example.

    messages=[sys, user(img), asst] + branches=[[u1, a1], [u2, a2]]

    tokens:  | sys user img asst | u1 a1 | u2 a2 |
    nodes:     0 (parent -1)       1 (0)   2 (0)
    position:  0 ........... 9     10..14  10..14   (a branch continues from its parent's end)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IGNORE_INDEX = -100  # the label of a token that carries no loss (PyTorch's cross_entropy default)


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image named by a record: a resolved file path, or inline bytes."""

    path: str = ""
    data: bytes | None = None

    @property
    def source(self) -> str:
        return self.path if self.data is None else f"<inline {len(self.data)} bytes>"


@dataclass(frozen=True, slots=True)
class VideoRef:
    """One video named by a record: a resolved clip path, or resolved frame image paths, and its sampling
    options as the record gave them (``packer.models.shared.qwen_video_plan.VideoRequest`` reads them: fps, video_start, ...).

        {"type": "video", "video": "clip.mp4", "fps": 1}  ->  VideoRef(path="/data/clip.mp4", options=(("fps", 1),))
    """

    path: str = ""
    frames: tuple[str, ...] = ()  # a video given as frame images, in order ("" path)
    options: tuple[tuple[str, float], ...] = ()  # (name, value) pairs, sorted by name

    @property
    def source(self) -> str:
        return self.path if not self.frames else f"<{len(self.frames)} frames from {self.frames[0]}>"


@dataclass(frozen=True, slots=True)
class AudioRef:
    """One audio clip named by a record: a resolved file path, or inline bytes (a ``datasets.Audio`` cell), and
    the record's window in seconds (Qwen-Omni's ``audio_start`` / ``audio_end``; None: the clip's start / end).

    ``video`` marks a video's own sound track (``use_audio_in_video``): ``path`` is the video's clip, the window
    the video's, and it follows its VideoRef in the message's parts. The template writes no placeholder for it:
    the family lays it out inside the video's run (Qwen-Omni interleaves the two by time chunk).

        {"type": "audio", "audio": "clip.wav", "audio_start": 1.5}  ->  AudioRef(path="/data/clip.wav", start=1.5)
    """

    path: str = ""
    data: bytes | None = None
    start: float | None = None
    end: float | None = None
    video: bool = False

    @property
    def source(self) -> str:
        return self.path if self.data is None else f"<inline {len(self.data)} bytes>"

    @property
    def placeholder(self) -> bool:
        """Whether the chat template writes a placeholder for it (every clip but a video's own track)."""
        return not self.video


Part = str | ImageRef | VideoRef | AudioRef
"""One piece of a message's content."""


@dataclass(slots=True)
class Message:
    """One chat message. ``parts`` holds text strings, ImageRefs, VideoRefs and AudioRefs in order (empty for an
    assistant turn that only calls tools)."""

    role: str
    parts: list[Part]
    loss: bool | float | None = None  # None: the default (assistant turns carry loss); a float > 0: loss, weighted
    tool_calls: list[dict] | None = None  # an assistant's calls, as the record gives them (OpenAI style)
    tool_call_id: str | None = None  # a tool result's call id, passed to the template as given
    name: str | None = None  # a tool result's tool name, passed to the template as given

    @property
    def images(self) -> list[ImageRef]:
        return [p for p in self.parts if isinstance(p, ImageRef)]

    @property
    def videos(self) -> list[VideoRef]:
        return [p for p in self.parts if isinstance(p, VideoRef)]

    @property
    def audios(self) -> list[AudioRef]:
        return [p for p in self.parts if isinstance(p, AudioRef)]


@dataclass(slots=True)
class Node:
    """A node of a message tree: its own messages, then its continuations."""

    messages: list[Message]
    children: list[Node] = field(default_factory=list)

    def walk(self):
        """Yield (node, parent_index) depth-first, parents before children; the root's parent is -1."""
        stack: list[tuple[Node, int]] = [(self, -1)]
        index = 0
        while stack:
            node, parent = stack.pop()
            yield node, parent
            me = index
            index += 1
            for child in reversed(node.children):
                stack.append((child, me))


@dataclass(slots=True)
class Example:
    """One input record, parsed. ``kind`` is messages | llava | text | preference (a root prompt node and two
    children: node 1 the chosen answer, node 2 the rejected one)."""

    root: Node
    kind: str
    path: str
    line: int
    source_name: str = ""  # the named source of a mixed build ("" for a single source)
    text: str | None = None  # the whole text of a `text` record
    tools: list[dict] | None = None  # the record's tool definitions, passed to the chat template

    @property
    def example_id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def images(self) -> list[ImageRef]:
        return [im for node, _ in self.root.walk() for m in node.messages for im in m.images]

    @property
    def videos(self) -> list[VideoRef]:
        return [v for node, _ in self.root.walk() for m in node.messages for v in m.videos]

    @property
    def audios(self) -> list[AudioRef]:
        return [a for node, _ in self.root.walk() for m in node.messages for a in m.audios]


@dataclass(slots=True)
class EncodedImage:
    """One image inside an encoded example."""

    source: str  # resolved path ("" for inline bytes)
    data: bytes | None  # inline bytes, else None
    grid_thw: tuple[int, int, int]  # patch grid before merging (Qwen2-VL's image_grid_thw); llava: (1, 24, 24)
    offset: int  # index of the first vision token inside the example
    num_tokens: int  # number of vision tokens this image became


@dataclass(slots=True)
class EncodedVideo:
    """One video inside an encoded example: where it comes from, which frames and size the reader makes of it,
    and its place in the tokens. ``packer.media.video.VideoPlan`` is where the numbers come from."""

    source: str  # resolved clip path ("" for a frame list)
    frames: list[str]  # a frame list's resolved image paths ([] for a clip)
    video_start: float | None  # the record's window, seconds (None: the clip's start / end)
    video_end: float | None
    frame_indices: list[int]  # sampled frames, in order: indices into the clip, or into the (padded) frame list
    video_fps: float  # the clip's average frame rate (a frame list: its raw_fps)
    grid_thw: tuple[int, int, int]  # video_grid_thw: (frames / temporal patch, height / patch, width / patch)
    height: int  # frame size in the vision tower (pixels), after every resize
    width: int
    utils_height: int  # frame size after qwen-vl-utils' resize, before the HF processor's (often the same)
    utils_width: int
    offset: int  # index of the first video token inside the example
    num_tokens: int  # number of video tokens this video became
    second_per_grid_t: float  # seconds per temporal patch (Qwen2.5-VL's second_per_grid_ts)


@dataclass(slots=True)
class EncodedAudio:
    """One audio clip inside an encoded example: where it comes from, what the family's loader makes of it (the
    samples at its rate, from the header: ``packer.media.audio.loaded_num_samples``), the features the model
    reads of it, and its place in the tokens.

        3.2 s wav at 44.1 kHz, Qwen2.5-Omni  ->  sample_rate 16000, num_samples 51200, feature_length 320, 80 tokens
    """

    source: str  # resolved path ("" for inline bytes); a video's clip for its own track
    data: bytes | None  # inline bytes, else None
    audio_start: float | None  # the record's window, seconds (None: the clip's start / end)
    audio_end: float | None
    video: bool  # a video's own sound track (use_audio_in_video)
    sample_rate: int  # the rate the family's loader resamples to (Hz)
    num_samples: int  # mono samples the loader yields at sample_rate for the window
    feature_length: int  # the feature frames the model reads (Whisper: log-mel frames, hop 160)
    offset: int  # index of the first audio token inside the example
    num_tokens: int  # number of audio tokens this clip became
    padded_samples: int | None = None  # samples its features were computed over, zero-padded beside its example's
    # other clips (Qwen3-Omni pads every clip of a processor call to the longest); None: the clip's alone

    @property
    def seconds(self) -> float:
        return self.num_samples / self.sample_rate


@dataclass(slots=True)
class Encoded:
    """One example rendered to tokens. All arrays are int32 and cover the whole example."""

    example_id: str
    input_ids: np.ndarray  # (L,)
    labels: np.ndarray  # (L,) token id where the loss applies, IGNORE_INDEX elsewhere; NOT shifted
    position_ids: np.ndarray  # (L,) 1-D positions, restarting at 0, continuing along tree paths
    node_offsets: np.ndarray  # (N,) start of each node inside the example, node 0 at 0
    node_parents: np.ndarray  # (N,) parent node index, -1 for the root
    images: list[EncodedImage]
    mrope_position_ids: np.ndarray | None = None  # (3, L) for mRoPE models: int32, or float32 (Positions.fractional)
    source_name: str = ""
    videos: list[EncodedVideo] = field(default_factory=list)
    audios: list[EncodedAudio] = field(default_factory=list)
    loss_weights: np.ndarray | None = None  # (L,) float32 weight of each label, 0 where none; None: every weight 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def weighted_loss_tokens(self) -> float:
        """The loss tokens' summed weight (``num_loss_tokens`` when every weight is 1)."""
        if self.loss_weights is None:
            return float(self.num_loss_tokens)
        return float(self.loss_weights.sum(dtype=np.float64))

    @property
    def num_vision_tokens(self) -> int:
        """Image and video tokens: what the vision budget counts."""
        return sum(im.num_tokens for im in self.images) + sum(v.num_tokens for v in self.videos)

    @property
    def num_video_tokens(self) -> int:
        return sum(v.num_tokens for v in self.videos)

    @property
    def num_audio_tokens(self) -> int:
        """Audio tokens: what the audio budget counts (the audio tower's work, apart from the vision tower's)."""
        return sum(a.num_tokens for a in self.audios)
