"""The GLM-4.6V proof: a tiny ``Glm46VForConditionalGeneration`` (GLM-4V's vision tower with its 2-D rotary and
interpolated position embeddings, GLM-4's text model with partial rotary 3-D mRoPE), and one path alone as
``Glm46VProcessor`` gives it: its images as ``pixel_values`` / ``image_grid_thw``, its videos as
``pixel_values_videos`` / ``video_grid_thw`` (t, h, w), and ``mm_token_type_ids`` (1 for an image's ``<|image|>``,
2 inside ``<|begin_of_video|>`` ... ``<|end_of_video|>``), from which the model's own ``get_rope_index`` computes
the positions. The packed batch hands the same videos to the model as images (``reader.py``): this is what shows
that the two agree."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from packer.models.proof import Proof, tiny_text_config

VIDEO_START, VIDEO_END = "<|begin_of_video|>", "<|end_of_video|>"


class Glm46VProof(Proof):
    model_class = "Glm46VForConditionalGeneration"

    def model_tokens(self) -> tuple[str, ...]:
        p = self.profile
        return (p.image_token, p.vision_start, p.vision_end, p.video_token, VIDEO_START, VIDEO_END)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny GLM-4.6V: a 2-layer text model of hidden 64 (4 heads of 16, 2 KV heads), rotary on half of each
        head (``partial_rotary_factor`` 0.5, as the checkpoints) split t/h/w 2/1/1 of its 4 frequencies (the
        checkpoints' 8/12/12 of 32); a 1-block vision tower of width 32 at the profile's patch, merge and temporal
        patch sizes."""
        from transformers import Glm46VConfig, Glm46VForConditionalGeneration

        p = self.profile
        vision_dim = kw.pop("vision_dim", 32)
        text = tiny_text_config(vocab_size=vocab_size, **({"hidden": 64} | kw))
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                   "mrope_section": [2, 1, 1]}
        vision = dict(depth=1, hidden_size=vision_dim, intermediate_size=2 * vision_dim, num_heads=2,
                      image_size=112, patch_size=p.patch_size, spatial_merge_size=p.merge_size,
                      temporal_patch_size=p.temporal_patch_size, out_hidden_size=text["hidden_size"])
        config = Glm46VConfig(
            text_config=text, vision_config=vision, attn_implementation="sdpa",
            image_token_id=token_ids[p.image_token], video_token_id=token_ids[p.video_token],
            image_start_token_id=token_ids[p.vision_start], image_end_token_id=token_ids[p.vision_end],
            video_start_token_id=token_ids[VIDEO_START], video_end_token_id=token_ids[VIDEO_END],
        )
        return Glm46VForConditionalGeneration(config).float().train()

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        """One path's ids, its images' and videos' pixels as the processor gives that example alone, and its
        ``mm_token_type_ids`` (``Glm46VProcessor.create_mm_token_type_ids``)."""
        ids = batch["input_ids"][0]
        media = self.media_table(batch, token_ids)
        image_id = token_ids[self.profile.image_token]
        start_id, end_id = token_ids[VIDEO_START], token_ids[VIDEO_END]

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            path_ids = ids[tokens][None]
            out: dict[str, Any] = {"input_ids": path_ids, "use_cache": False}
            inside = [m for m in media if bool((tokens == m["offset"]).any())]
            images = [m for m in inside if m["kind"] == "image"]
            videos = [m for m in inside if m["kind"] == "video"]
            if images:
                out["pixel_values"] = torch.cat([m["pixels"] for m in images])
                out["image_grid_thw"] = torch.stack([m["grid"] for m in images])
            if videos:
                out["pixel_values_videos"] = torch.cat([m["pixels"] for m in videos])
                out["video_grid_thw"] = torch.stack([m["grid"] for m in videos])
            if inside:
                is_video = torch.cumsum(path_ids == start_id, -1) > torch.cumsum(path_ids == end_id, -1)
                is_image = path_ids == image_id
                out["mm_token_type_ids"] = (is_image & ~is_video).int() + 2 * (is_image & is_video).int()
            return out

        return inputs

    def media_table(self, batch: Mapping[str, Any], token_ids: dict[str, int]) -> list[dict[str, Any]]:
        """Every image and video of the batch in token order: its first token, kind, pixel rows and grid.

        The batch's ``image_grid_thw`` holds one (1, h, w) row per image and per temporal patch of a video, in
        token order (``Glm46VReader``); a video's patches are the runs of ``<|image|>`` from its offset to the next
        entry's (the batch's end for the last), its grid (patches, h, w)."""
        entries = [(int(o), "image") for o in batch.get("image_offsets", torch.zeros(0)).tolist()]
        entries += [(int(o), "video") for o in batch.get("video_offsets", torch.zeros(0)).tolist()]
        if not entries:
            return []
        entries.sort()
        ids = batch["input_ids"][0]
        is_image = (ids == token_ids[self.profile.image_token]).to(torch.int8)
        run_starts = torch.diff(is_image, prepend=torch.zeros(1, dtype=torch.int8)) == 1  # (T,)
        ends = [o for o, _ in entries[1:]] + [ids.numel()]
        grids, pixels = batch["image_grid_thw"], batch["pixel_values"]
        out, row, at = [], 0, 0
        for (off, kind), end in zip(entries, ends, strict=True):
            t = 1 if kind == "image" else int(run_starts[off:end].sum())
            g = grids[row : row + t]
            n = int(g.prod(-1).sum())
            grid = g[0].clone() if kind == "image" else torch.tensor([t, int(g[0, 1]), int(g[0, 2])])
            out.append({"offset": off, "kind": kind, "pixels": pixels[at : at + n], "grid": grid})
            row, at = row + t, at + n
        return out
