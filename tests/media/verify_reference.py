"""Check qwen_reference.py's transcription against the real qwen-vl-utils code (a manual check, not a test).

    pip download --no-deps qwen-vl-utils==0.0.14 -d /tmp/qvu
    PACKER_SHARED=../shared python tests/media/verify_reference.py /tmp/qvu/qwen_vl_utils-0.0.14-py3-none-any.whl

qwen_vl_utils imports torchvision at module level and reads videos with decord; neither installs here. This
script imports the wheel as it is (a wheel is a zip, so it imports from sys.path) after putting two stand-ins
in sys.modules: ``decord.VideoReader`` backed by qwen_reference.AllFrames (PyAV, every frame decoded) and a
``torchvision`` whose ``transforms.functional.resize`` is torch's bicubic antialiased interpolate. Then it runs
the real ``fetch_video`` and the transcribed one on every test clip, request and patch size (14, 16), and on
COCO frame lists, and compares frame counts, indices, metadata, sample_fps and the resized shape.

Where the real code raises inside the decord reader it retries with torchvision's ``io.read_video``, which the
stand-in lacks (AttributeError); those cases count as "both raise" when the transcription raises too.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import COCO  # noqa: E402
from tests.media import qwen_reference as ref  # noqa: E402  (imports transformers before the stand-ins)
from tests.media.make_videos import GOOD, make_test_videos  # noqa: E402
from tests.media.test_video import REQUESTS  # noqa: E402


def install_stand_ins() -> None:
    torchvision = types.ModuleType("torchvision")
    torchvision.__version__ = "0.20.0"
    transforms = types.ModuleType("torchvision.transforms")
    transforms.InterpolationMode = types.SimpleNamespace(BICUBIC="bicubic")
    transforms.functional = types.SimpleNamespace(
        resize=lambda video, size, interpolation=None, antialias=True: torch.nn.functional.interpolate(
            video.float(), size=tuple(size), mode="bicubic", antialias=True, align_corners=False
        )
    )
    torchvision.io, torchvision.transforms = types.ModuleType("torchvision.io"), transforms
    decord = types.ModuleType("decord")

    class VideoReader:
        def __init__(self, path):
            self.frames = ref.AllFrames(path)

        def __len__(self):
            return len(self.frames)

        def get_avg_fps(self):
            return self.frames.get_avg_fps()

        def get_batch(self, idx):
            return types.SimpleNamespace(asnumpy=lambda: self.frames.get_batch(idx))

    decord.VideoReader = VideoReader
    sys.modules.update({"torchvision": torchvision, "torchvision.io": torchvision.io,
                        "torchvision.transforms": transforms, "decord": decord})
    os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"


def outcome(fn, *args):
    try:
        video, meta, sample_fps = fn(*args)
        return tuple(video.shape), list(meta["frames_indices"]), meta["total_num_frames"], meta["fps"], sample_fps
    except Exception as e:  # noqa: BLE001 - both sides' failures are compared by kind
        return ("raises", type(e).__name__)


def main(wheel: str) -> int:
    install_stand_ins()
    sys.path.insert(0, wheel)
    from qwen_vl_utils import vision_process as real

    def real_fetch(ele, patch):
        (video, meta), sample_fps = real.fetch_video(
            dict(ele), image_patch_size=patch, return_video_sample_fps=True, return_video_metadata=True
        )
        return video, meta, sample_fps

    def mine(ele, patch, vr=None):
        video, size, meta, sample_fps = ref.fetch_video(dict(ele), patch, vr)
        return torch.empty(video.shape[0], video.shape[1], *size), meta, sample_fps

    photos = sorted(COCO.glob("*/*.jpg"))
    cases = same = both_raise = 0
    with tempfile.TemporaryDirectory() as tmp:
        videos = make_test_videos(Path(tmp), photos)
        jobs = []
        for name in GOOD:
            vr = ref.AllFrames(str(videos[name]))
            jobs += [({"type": "video", "video": str(videos[name]), **r}, p, vr) for r in REQUESTS for p in (14, 16)]
        from PIL import Image

        same_size = [str(p) for p in photos if Image.open(p).size == (640, 480)][:5]
        for r in [{}, {"sample_fps": 1}, {"min_pixels": 3136, "max_pixels": 50176},
                  {"resized_height": 280, "resized_width": 420}, {"raw_fps": 30, "sample_fps": 2}, {"fps": 4}]:
            jobs += [({"type": "video", "video": same_size, **r}, p, None) for p in (14, 16)]
        for ele, patch, vr in jobs:
            want, got = outcome(real_fetch, ele, patch), outcome(mine, ele, patch, vr)
            cases += 1
            if want == got:
                same += 1
            elif want[0] == got[0] == "raises":
                both_raise += 1
            else:
                print("DIFFERENT", ele.get("video") if isinstance(ele["video"], str) else "frame list", patch,
                      {k: v for k, v in ele.items() if k not in ("type", "video")}, want, got)
    print(f"{cases} cases: {same} identical, {both_raise} raise in both (different exception), "
          f"{cases - same - both_raise} different")
    return 0 if same + both_raise == cases else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
