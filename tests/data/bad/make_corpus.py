"""Regenerate the fuzz corpus in this directory: ``python tests/data/bad/make_corpus.py``.

Every line of every JSONL file here is one case; ``expected.json`` gives, per file, the build config and,
per line, what must become of it: ``packed``, ``blank`` (not a record), or the exact reject reason.
tests/pipeline/test_reliability.py builds each file and checks every line. The bytes are written exactly (a BOM,
CRLF endings, a line that is not UTF-8, a last line without a newline), so do not let an editor re-save them.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # run as a script from anywhere: tests.media is beside it

from tests.media.audio_clips import signal  # noqa: E402
from tests.media.audio_clips import write_clip as write_audio  # noqa: E402
from tests.media.make_videos import (  # noqa: E402
    truncate,
    write_audio_only,
    write_clip,
    write_without_frames,
)


def _images() -> str:
    """good.jpg / good.png (real, small), truncated.jpg, text.jpg, empty.jpg; returns a tiny PNG data URL."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)  # noise: a JPEG with a long scan
    Image.fromarray(pixels).save(HERE / "good.jpg", quality=85)
    Image.fromarray(pixels[:40, :60]).save(HERE / "good.png")
    data = (HERE / "good.jpg").read_bytes()
    (HERE / "truncated.jpg").write_bytes(data[: len(data) // 2])  # cut mid-scan: no end-of-image marker
    (HERE / "text.jpg").write_text("this file is text, not a JPEG\n")
    (HERE / "empty.jpg").write_bytes(b"")
    buf = io.BytesIO()
    Image.fromarray(pixels[:20, :20]).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def U(content):  # noqa: N802 - short builders keep the case table readable
    return {"role": "user", "content": content}


def A(content):  # noqa: N802
    return {"role": "assistant", "content": content}


def img(path: str, text: str = "What is in the picture?") -> list[dict]:
    return [{"type": "image", "image": path}, {"type": "text", "text": text}]


def _records(data_url: str) -> list[tuple[bytes | str | dict | None, str, str]]:
    """(line, expected, case) for records.jsonl. A dict is JSON-encoded; bytes are written as they are; None
    is a blank line. Line endings are added by the writer (CRLF where the case says so)."""
    long_text = " ".join(["word"] * 400)
    return [
        # -- good records of every format (each must be packed)
        ({"text": "A plain pretraining text, behind a byte-order mark."}, "packed", "BOM before line 1"),
        ({"messages": [U("What is 2 + 2?"), A("4.")]}, "packed", "chat"),
        ({"messages": [U(img("good.jpg")), A("Noise.")]}, "packed", "image by relative path"),
        ({"conversations": [{"from": "human", "value": "<image>\nDescribe."}, {"from": "gpt", "value": "Noise."}],
          "image": "good.png"}, "packed", "LLaVA with a placeholder"),
        ({"messages": [U(img("good.jpg", "Caption it."))],
          "branches": [[A("Grey noise.")], {"messages": [A("Static.")], "branches": [[U("Sure?"), A("Yes.")]]}]},
         "packed", "message tree"),
        ({"messages": [U([{"type": "image", "image": data_url}, {"type": "text", "text": "Inline?"}]), A("Yes.")]},
         "packed", "inline data-URL image"),
        ({"messages": [U([{"type": "image_url", "image_url": {"url": "good.png"}}, {"type": "text", "text": "Hm?"}]),
                       A("A PNG.")]}, "packed", "OpenAI image_url part"),
        ({"messages": [{"role": "system", "content": "Be brief."}, U("Hi"), A("Hello.")]}, "packed", "CRLF ending (crlf)"),
        (None, "blank", "empty line"),
        (b"   \t ", "blank", "whitespace-only line"),
        (None, "blank", "empty line with CRLF (crlf)"),
        # -- not JSON / not UTF-8
        (b'{"messages": [', "malformed_json", "truncated JSON"),
        (b"{'text': 'single quotes'}", "malformed_json", "not JSON syntax"),
        ([1, 2, 3], "malformed_json", "a JSON array, not an object"),
        ("just a string", "malformed_json", "a JSON string, not an object"),
        (b"[" * 5000 + b"]" * 5000, "malformed_json", "nested 5000 deep (RecursionError)"),
        (b'{"text": "x", "n": ' + b"7" * 5000 + b"}", "malformed_json", "5000-digit integer (ValueError)"),
        (b'{"text": "caf\xe9 latin-1"}', "not_utf8", "a Latin-1 byte"),
        (b'{"text": "\\ud800 lone surrogate"}', "not_utf8", "lone UTF-16 surrogate escape"),
        # -- format and types
        ({"prompt": "x", "completion": "y"}, "unknown_format", "no known key"),
        ({}, "unknown_format", "empty object"),
        ({"messages": [U(5), A("x")]}, "wrong_type", "content is a number"),
        ({"messages": [{"role": 1, "content": "x"}, A("y")]}, "wrong_type", "role is a number"),
        ({"messages": "hello"}, "wrong_type", "messages is a string"),
        ({"messages": None}, "wrong_type", "messages is null"),
        ({"messages": ["hi", A("x")]}, "wrong_type", "a message is a string"),
        ({"messages": [U([{"type": "sound", "sound": "a.wav"}]), A("x")]}, "wrong_type", "unsupported part type"),
        ({"messages": [U([{"type": "image", "image": 5}]), A("x")]}, "wrong_type", "image source is a number"),
        ({"messages": [U("x"), {"role": "assistant", "content": "y", "loss": "yes"}]}, "wrong_type", "loss is a string"),
        ({"text": 5}, "wrong_type", "text is a number"),
        (b'{"text": NaN}', "wrong_type", "text is NaN"),
        ({"conversations": [{"from": "human", "value": ["x"]}, {"from": "gpt", "value": "y"}]}, "wrong_type",
         "LLaVA value is a list"),
        ({"messages": [U("x"), A("y")], "branches": ["z"]}, "wrong_type", "a branch is a string"),
        ({"messages": [U("x"), A("y")], "id": [1]}, "wrong_type", "id is a list"),
        ({"messages": [U("x")], "images": 7}, "wrong_type", "images is a number"),
        # -- roles, emptiness
        ({"messages": [{"role": "robot", "content": "x"}, A("y")]}, "unknown_role", "unknown chat role"),
        ({"conversations": [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "y"}]}, "unknown_role",
         "unknown LLaVA role"),
        ({"messages": []}, "empty_messages", "no messages"),
        ({"messages": [U("x"), A("")]}, "empty_messages", "empty content"),
        ({"messages": [U("x"), {"role": "assistant"}]}, "empty_messages", "no content key"),
        ({"conversations": []}, "empty_messages", "no LLaVA turns"),
        ({"text": ""}, "empty_messages", "empty text"),
        ({"messages": [U("x"), A("y")], "branches": [[]]}, "empty_branch", "an empty branch list"),
        ({"messages": [U("x"), A("y")], "branches": [{"messages": []}]}, "empty_branch", "an empty branch object"),
        ({"messages": [U("x")], "branches": [{"messages": [A("y")], "branches": [[]]}]}, "empty_branch",
         "an empty nested branch"),
        # -- images
        ({"messages": [U(img("missing.jpg")), A("x")]}, "missing_image", "image file does not exist"),
        ({"messages": [U(img("http://example.com/a.jpg")), A("x")]}, "missing_image", "a URL (offline)"),
        ({"messages": [U(img("truncated.jpg")), A("x")]}, "bad_image", "truncated JPEG"),
        ({"messages": [U(img("text.jpg")), A("x")]}, "bad_image", "text file named .jpg"),
        ({"messages": [U(img("empty.jpg")), A("x")]}, "bad_image", "zero-byte file"),
        ({"messages": [U(img("data:image/png;base64,!!!")), A("x")]}, "bad_image", "data URL, bad base64"),
        ({"conversations": [{"from": "human", "value": "<image> and <image>"}, {"from": "gpt", "value": "x"}],
          "image": "good.png"}, "image_count_mismatch", "two placeholders, one image"),
        ({"conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "x"}]},
         "image_count_mismatch", "a placeholder, no image"),
        ({"messages": [U([{"type": "image"}, {"type": "text", "text": "x"}]), A("y")], "images": ["good.png", "good.jpg"]},
         "image_count_mismatch", "two images, one placeholder"),
        ({"messages": [U("look: <|image_pad|>"), A("x")]}, "image_count_mismatch", "literal image token in text"),
        ({"messages": [U(img("good.jpg") + img("good.png") + img("good.jpg")), A("Three.")]}, "overlong",
         "3 images exceed --max-vision-tokens (budget)"),
        # -- loss and length
        ({"messages": [U("only a question")]}, "no_loss_tokens", "no assistant turn"),
        ({"messages": [U("x"), {"role": "assistant", "content": "y", "loss": False}]}, "no_loss_tokens",
         "assistant turn with loss false"),
        ({"text": long_text}, "overlong", "longer than --max-length (drop)"),
        ({"messages": [U(long_text), A("ok")]}, "overlong", "long chat (drop)"),
        # -- audio (the header-level rejects need an audio profile: tests/media/test_audio.py, the families' tests)
        ({"messages": [U([{"type": "audio", "audio": "missing.wav"}]), A("x")]}, "missing_audio",
         "audio file does not exist"),
        ({"messages": [U([{"type": "audio", "audio": "data:audio/wav;base64,!!!"}]), A("x")]}, "bad_audio",
         "audio data URL, bad base64"),
        ({"messages": [U([{"type": "audio", "audio": "audio.m4a"}, {"type": "text", "text": "Said?"}]), A("x")]},
         "unsupported_medium", "a clip for a profile without audio (qwen2-vl)"),
        ({"system": "Be brief.", "messages": [{"role": "system", "content": "Be kind."}, U("x"), A("y")]},
         "conflicting_system", "a top-level system prompt beside another of its own"),
        ({"messages": [{"role": "robot", "content": "x"}, A("y")]}, "unknown_role", "last line, no newline (nonl)"),
    ]


def _truncate_records() -> list[tuple[dict, str, str]]:
    long_q = " ".join(["question"] * 300)
    return [
        ({"messages": [U("Short question."), A("Short answer.")]}, "packed", "fits"),
        ({"messages": [U("What is this?"), A(" ".join(["answer"] * 300))]}, "packed", "long answer: truncated"),
        ({"messages": [U(long_q), A("The answer.")]}, "untruncatable", "the cut leaves no loss token"),
        ({"messages": [U(img("good.jpg", long_q)), A("x")]}, "untruncatable", "image kept, cut before the answer"),
        ({"text": " ".join(["text"] * 500)}, "packed", "text: truncated, loss remains"),
    ]


def _videos() -> None:
    """good.mp4 (2 s, 64x48 at 8 fps, faststart: its header comes first), truncated.mp4 (its first half),
    text.mp4, audio.m4a (no video stream), no_frames.mkv (a video stream without packets)."""
    write_clip(HERE / "good.mp4", fps=8, frames=16, width=64, height=48, options={"movflags": "faststart"})
    truncate(HERE / "good.mp4", HERE / "truncated.mp4")
    (HERE / "text.mp4").write_text("this file is text, not a video\n")
    write_audio_only(HERE / "audio.m4a")
    write_without_frames(HERE / "no_frames.mkv")


def vid(source, text: str = "What happens?", **options) -> list[dict]:
    return [{"type": "video", "video": source, **options}, {"type": "text", "text": text}]


def _video_records() -> list[tuple[dict, str, str]]:
    """videos.jsonl (qwen2.5-vl): good.mp4 (64x48) plans to 4 frames of 392x280 -> grid (2, 20, 28) -> 280 tokens at the video
    processor's class defaults; the budget of 300 vision tokens fits one clip, not two."""
    llava = [{"from": "human", "value": "<video>\nDescribe."}, {"from": "gpt", "value": "Grey levels."}]
    return [
        ({"messages": [U(vid("good.mp4")), A("Flat grey frames.")]}, "packed", "a clip"),
        ({"conversations": llava, "video": "good.mp4"}, "packed", "LLaVA-Video: <video> and a top-level video"),
        ({"messages": [U(vid("good.mp4", "Ask."))], "branches": [[A("One answer.")], [A("Another.")],
                                                                 [A("A third.")]]},
         "packed", "a video message tree: one clip, three answers"),
        ({"messages": [U(vid(["good.jpg", "good.jpg", "good.jpg"], fps=1)), A("Noise.")]}, "packed",
         "a frame list (padded to 4 frames)"),
        ({"messages": [U(vid("good.mp4", video_start=0.5, video_end=1.5)), A("x")]}, "packed",
         "video_start / video_end inside the clip"),
        ({"messages": [U(img("good.jpg") + vid("good.mp4")), A("Both.")]}, "packed", "an image and a clip"),
        ({"messages": [U(vid("missing.mp4")), A("x")]}, "missing_video", "video file does not exist"),
        ({"messages": [U(vid("truncated.mp4")), A("x")]}, "bad_video", "truncated mp4 (half the file)"),
        ({"messages": [U(vid("text.mp4")), A("x")]}, "bad_video", "text file named .mp4"),
        ({"messages": [U(vid("audio.m4a")), A("x")]}, "bad_video", "no video stream"),
        ({"messages": [U(vid("no_frames.mkv")), A("x")]}, "bad_video", "a video stream with no frames"),
        ({"messages": [U(vid("good.mp4", video_start=5)), A("x")]}, "bad_video", "video_start after the clip's end"),
        ({"messages": [U(vid("good.mp4", video_end=9)), A("x")]}, "bad_video", "video_end far past the clip's end"),
        ({"messages": [U(vid("good.mp4") + vid("good.mp4")), A("x")]}, "overlong",
         "two clips exceed --max-vision-tokens (budget)"),
        ({"messages": [U(vid("good.mp4", fps="two")), A("x")]}, "wrong_type", "a video option that is not a number"),
        ({"conversations": llava}, "image_count_mismatch", "a <video> placeholder, no video"),
    ]


# A template in the style of Llama-2 / Mistral, which refuse conversations whose roles do not alternate.
ALTERNATING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
    "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _template_records() -> list[tuple[dict, str, str]]:
    return [
        ({"messages": [U("Hi"), A("Hello.")]}, "packed", "alternating roles"),
        ({"messages": [U("Hi"), U("Again"), A("Hello.")]}, "template_error", "the template raises"),
        ({"messages": [A("I start."), U("Hm"), A("Yes.")]}, "template_error", "assistant first"),
    ]


def _molmo2_records() -> list[tuple[dict, str, str]]:
    a, b = {"type": "image", "image": "good.jpg"}, {"type": "image", "image": "good.png"}
    return [
        ({"messages": [U(img("good.jpg"))], "branches": [[A("One.")], [A("Two.")]]}, "packed",
         "image in the shared prefix only"),
        ({"messages": [U("Look."), A("Yes.")], "branches": [[U([a]), A("One.")], [U([b]), A("Two.")]]}, "packed",
         "an image in each branch, none shared"),
        ({"messages": [U(img("good.jpg")), A("Ok.")], "branches": [[U([b]), A("One.")], [A("Two.")]]}, "image_tree",
         "an image in the prefix and one in a branch (Molmo2's block differs per branch)"),
        ({"messages": [U(img("good.jpg")), A("Ok.")], "branches": [{"messages": [U([b]), A("Deeper.")],
                                                                   "branches": [[A("x")], [A("y")]]}]},
         "packed", "a single branch with an image (no branch point between the images)"),
    ]


def _llava_onevision_records() -> list[tuple[dict, str, str]]:
    a, b = {"type": "image", "image": "good.jpg"}, {"type": "image", "image": "good.png"}
    return [
        ({"messages": [U("Look."), A("Yes.")], "branches": [[U([a]), A("One.")], [U([b]), A("Two.")]]}, "packed",
         "an image in each branch, none shared (one per path: each tiled)"),
        ({"messages": [U(img("good.jpg")), A("Ok.")], "branches": [[U([b]), A("One.")], [U([a]), A("Two.")]]},
         "packed", "an image in the prefix and one in every branch (two per path: all untiled)"),
        ({"messages": [U(img("good.jpg")), A("Ok.")], "branches": [[U([b]), A("One.")], [A("Two.")]]}, "image_tree",
         "an image in the prefix, one branch adding an image and one not (tiled on one path only)"),
    ]


def _clips() -> None:
    """tone.wav (0.25 s), speech.wav (0.1 s) and blip.wav (100 samples: no mel frame alone), mono 16 kHz PCM
    (Qwen3-Omni's rate: no resampling moves a length)."""
    write_audio(HERE / "tone.wav", signal("tone", 16000, 0.25), 16000)
    write_audio(HERE / "speech.wav", signal("speech", 16000, 0.1), 16000)
    write_audio(HERE / "blip.wav", signal("tone", 16000, num_samples=100), 16000)


def aud(path: str, text: str | None = None) -> list[dict]:
    return [{"type": "audio", "audio": path}] + ([{"type": "text", "text": text}] if text else [])


def _qwen3_omni_records() -> list[tuple[dict, str, str]]:
    """qwen3-omni pads an example's clips to its longest (tone.wav 4000 samples > speech.wav 1600 > blip.wav
    100), so a clip's features depend on the clips beside it on its path."""
    return [
        ({"messages": [U(aud("speech.wav", "Said?"))],
          "branches": [[A("One.")], [A("Two."), U(aud("tone.wav", "And?")), A("Three.")]]}, "audio_tree",
         "a root clip under one branch with a longer clip and one without (padded apart)"),
        ({"messages": [U(aud("tone.wav", "Said?"))],
          "branches": [[A("One.")], [A("Two."), U(aud("speech.wav", "And?")), A("Three.")]]}, "packed",
         "a root clip that is every path's longest (padded alike)"),
        ({"messages": [U(aud("speech.wav") + aud("tone.wav", "Same?")), A("No.")]}, "packed",
         "two clips of different lengths in one example"),
        ({"messages": [U(aud("blip.wav", "Said?")), A("x")]}, "bad_audio",
         "a 100-sample clip alone (no mel frame the processor can compute)"),
        ({"messages": [U(aud("blip.wav") + aud("tone.wav", "Both?")), A("x")]}, "packed",
         "the 100-sample clip beside a longer one (padded to it: one frame)"),
    ]


def _write(name: str, cases, config: dict) -> dict:
    out = bytearray()
    expect, notes = {}, {}
    for number, (line, want, case) in enumerate(cases, start=1):
        if line is None:
            raw = b""
        elif isinstance(line, bytes):
            raw = line
        else:
            raw = json.dumps(line).encode()
        if number == 1 and name == "records.jsonl":
            raw = b"\xef\xbb\xbf" + raw
        end = b"" if "(nonl)" in case else b"\r\n" if "(crlf)" in case else b"\n"
        out += raw + end
        expect[str(number)] = want
        notes[str(number)] = case
    (HERE / name).write_bytes(bytes(out))
    return {"config": config, "expect": expect, "cases": notes}


def main() -> None:
    data_url = _images()
    _videos()
    _clips()
    common = {"profile": "qwen2-vl", "max_pixels": 64 * 28 * 28, "max_length": 256}
    spec = {
        "records.jsonl": _write("records.jsonl", _records(data_url), {**common, "max_vision_tokens": 30}),
        "truncate.jsonl": _write("truncate.jsonl", _truncate_records(), {**common, "max_length": 64,
                                                                          "overlong": "truncate"}),
        "template.jsonl": _write("template.jsonl", _template_records(), {**common,
                                                                          "chat_template": ALTERNATING_TEMPLATE}),
        "videos.jsonl": _write("videos.jsonl", _video_records(), {**common, "profile": "qwen2.5-vl",
                                                                  "max_length": 1024, "max_vision_tokens": 300}),
        "molmo2.jsonl": _write("molmo2.jsonl", _molmo2_records(), {"profile": "molmo2", "max_length": 2048}),
        "llava_onevision.jsonl": _write("llava_onevision.jsonl", _llava_onevision_records(),
                                        {"profile": "llava-onevision", "max_length": 8192}),
        "qwen3_omni.jsonl": _write("qwen3_omni.jsonl", _qwen3_omni_records(), {"profile": "qwen3-omni",
                                                                              "max_length": 1024}),
    }
    (HERE / "expected.json").write_text(json.dumps({"files": spec}, indent=1) + "\n")


if __name__ == "__main__":
    main()
