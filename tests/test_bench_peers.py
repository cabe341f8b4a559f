"""scripts/bench_peers.py's Qwen2-VL processor directory: the peers load it as a downloaded checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image
from transformers import Qwen2VLProcessor

from packer.encode.tokenizers import load_tokenizer
from packer.models.registry import get_profile
from tests.helpers import load_script


def test_processor_dir_loads_back_and_counts_as_packer(tmp_path: Path) -> None:
    bench = load_script("bench_peers")
    bench.save_processor(tmp_path)
    assert json.loads((tmp_path / "processor_config.json").read_text()) == {"processor_class": "Qwen2VLProcessor"}
    video = json.loads((tmp_path / "video_preprocessor_config.json").read_text())
    assert (video["video_processor_type"], video["min_pixels"], video["max_pixels"]) == (
        "Qwen2VLVideoProcessor", 128 * 28 * 28, 768 * 28 * 28)

    processor = bench.qwen2vl_processor(str(tmp_path))  # AutoProcessor where torchvision is there
    assert isinstance(processor, Qwen2VLProcessor) and processor.image_processor.size["longest_edge"] == 12845056
    profile = get_profile("qwen2-vl")
    image = Image.new("RGB", (640, 426), (120, 30, 200))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A purple square."}]}]
    text = processor.apply_chat_template(msgs, tokenize=False)
    assert text == load_tokenizer("qwen2-vl").apply_chat_template(msgs, tokenize=False)  # the same template

    out = processor(text=[text], images=[image])
    grid = tuple(out["image_grid_thw"][0].tolist())
    assert grid == tuple(profile.image.grid_thw(640, 426)) == (1, 30, 46)
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert list(out["input_ids"][0]).count(image_pad) == 30 * 46 // 4
