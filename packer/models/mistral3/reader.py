"""The Mistral 3 reader: ``PixtralImageProcessorPil`` (no torchvision) as PixtralProcessor calls it, with the
processor's patch size (patch_size * spatial_merge_size), on the batch's images in token order.

    pixel_values (images, 3, H, W)   image_sizes (images, 2)

Every image is resized to whole 28-px tokens and put at the top left of the batch's largest height and width
(zeros elsewhere); ``image_sizes`` says how much of each is the image. The vision tower cuts each image back
to its own patches (``image_sizes``) before it runs, so the padding never reaches the model.
"""

from __future__ import annotations

from typing import Any

from packer.models.reader import Reader


class Mistral3Reader(Reader):
    def make_image_processor(self) -> Any:
        # Mistral-Small-3.1's preprocessor_config: the class defaults (bicubic, rescale 1/255, CLIP mean/std,
        # RGB, pad) but ``size``; PixtralProcessor passes patch_size * spatial_merge_size as the patch size.
        # The PIL backend: torchvision is not a dependency.
        from transformers import PixtralImageProcessorPil

        p = self.profile
        return PixtralImageProcessorPil(size={"longest_edge": p.longest_edge},
                                        patch_size={"height": p.image.unit, "width": p.image.unit})
