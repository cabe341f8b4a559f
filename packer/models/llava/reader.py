"""The LLaVA-1.5 reader: ``LlavaImageProcessorPil`` as llava-hf's preprocessor config sets it (no torchvision)."""

from __future__ import annotations

from typing import Any

from packer.models.reader import Reader


class LlavaReader(Reader):
    def make_image_processor(self) -> Any:
        # The PIL backend (torchvision is not a dependency). LLaVA-1.5 (llava-hf/llava-1.5-7b-hf
        # preprocessor_config): CLIP preprocessing, shortest edge resized to 336 then a 336x336 centre crop,
        # no padding to square.
        from transformers import LlavaImageProcessorPil
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

        side = self.profile.image_px
        return LlavaImageProcessorPil(
            size={"shortest_edge": side},
            crop_size={"height": side, "width": side},
            do_center_crop=True,
            do_pad=False,
            resample=PILImageResampling.BICUBIC,
            image_mean=OPENAI_CLIP_MEAN,
            image_std=OPENAI_CLIP_STD,
            do_convert_rgb=True,
        )
