"""Typed errors and the closed set of reject reasons.

Every input line that is not packed ends in ``rejects.jsonl`` with one of ``REJECT_REASONS``;
the stats count rejects by these codes, and ``docs/reliability.md`` documents each one.
"""

from __future__ import annotations

# Reason code -> one-line explanation (used in docs and `packer stats`).
REJECT_REASONS: dict[str, str] = {
    "not_utf8": "the line is not valid UTF-8",
    "malformed_json": "the line is not a JSON object",
    "unknown_format": "the record has none of `messages`, `conversations`, `text`",
    "wrong_type": "a field has the wrong type (e.g. content not a string or a list of parts)",
    "unknown_role": "a message role is not one of system/user/assistant/tool (or human/gpt)",
    "empty_messages": "the record has no messages, or a message has no content",
    "empty_branch": "a tree branch has no messages",
    "conflicting_system": "the record has a top-level system prompt and a different system message of its own",
    "missing_image": "an image file named by the record does not exist",
    "bad_image": "an image file cannot be read as an image (corrupt, truncated, not an image)",
    "missing_video": "a video file named by the record does not exist",
    "bad_video": "a video cannot be used: unreadable or truncated container, no video stream, no frames, or "
    "sampling options (video_start/end, nframes, pixels) that do not fit the clip",
    "missing_audio": "an audio file named by the record does not exist",
    "bad_audio": "an audio clip cannot be used: unreadable or empty file, no audio stream (in an audio file, or in a "
    "video whose sound track is asked for), or a start/end window that holds no sample of the clip",
    "unsupported_medium": "the record names a medium (audio, a video's sound track) the profile's model does not take",
    "image_count_mismatch": "the number of <image> placeholders differs from the number of images",
    "template_error": "the chat template failed or is not prefix-stable for this record",
    "image_tree": "a tree node with images is shared by branches that hold images of their own, which a model "
    "attending all of a sequence's images as one block (Molmo2) would see differently per branch, or by branches "
    "that disagree on whether it is their only image, which LLaVA-OneVision tiles only then",
    "audio_tree": "a tree node's audio clip would be padded to different lengths by the branches that share it "
    "(Qwen3-Omni pads an example's clips to its longest), so no one set of its features is every branch's",
    "no_loss_tokens": "the example has no token that contributes to the loss",
    "overlong": "the example is longer than --max-length (with --overlong drop)",
    "untruncatable": "the example cannot be truncated without cutting an image or losing all loss tokens",
}


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class ConfigError(PackerError):
    """A build option is invalid; the message names the option, the value and what is allowed."""


class ShardError(PackerError):
    """A shard directory is missing, unfinished, corrupt or of another schema version."""


class StorageError(PackerError):
    """A read or write of the inputs or the output (an object store, a disk) failed past its retries; the message
    names the stage and the object. What was committed stays: rerunning the command resumes."""


class RejectRateError(PackerError):
    """More of the input was rejected than --max-reject-fraction allows (exit code 3)."""


class RecordError(PackerError):
    """One input record cannot be used. Carries the reason code and where it came from."""

    def __init__(self, reason: str, message: str, *, path: str = "", line: int = 0):
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        self.reason = reason
        self.message = message
        self.path = path
        self.line = line
        super().__init__(self.__str__())

    def __reduce__(self):  # keyword-only fields: pickle (e.g. from a worker process) needs the recipe
        return _record_error, (self.reason, self.message, self.path, self.line)

    def located(self, path: str, line: int) -> RecordError:
        """Return the same error with its file and line filled in."""
        return RecordError(self.reason, self.message, path=path, line=line)

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}: " if self.path else ""
        return f"{where}{self.reason}: {self.message}"


def _record_error(reason: str, message: str, path: str, line: int) -> RecordError:
    return RecordError(reason, message, path=path, line=line)
