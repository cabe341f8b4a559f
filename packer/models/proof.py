"""``Proof``: the proof side of a family (``ModelProfile.proof()``): what ``scripts/check_equivalence.py`` and the
equivalence tests need to show packed == unpacked on the family's real transformers class, apart from what the
build needs. A tiny random-weight model of the class (``tiny_model``), the tokens its config names
(``model_tokens``), and how ONE root-to-leaf path runs alone with the model's own defaults (``path_inputs``:
its positions, its attention, its share of the batch's pixels). Imported only for a proof: torch and
transformers load here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from packer.errors import ConfigError

if TYPE_CHECKING:
    from packer.models.base import ModelProfile


def tiny_text_config(
    *, vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2
) -> dict[str, Any]:
    """A tiny language model's config kwargs: hidden 32, 2 layers, 4 heads, 2 KV heads (GQA), untied head.

    Generation ids are None: they are irrelevant to a loss and may not exist in a renumbered vocabulary.
    """
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


class Proof:
    """The base: a causal LM of ``model_class`` whose paths take their images whole (one leading entry each)."""

    model_class: str | None = None
    """The transformers class of the family's model (``tiny_model`` builds one), or None where none runs."""

    def __init__(self, profile: ModelProfile):
        self.profile = profile

    def model_tokens(self) -> tuple[str, ...]:
        """The tokens whose ids ``tiny_model``'s config names: the placeholder and delimiters by default.

        The equivalence check renumbers a build's ids to a small vocabulary and keeps these distinct.
        """
        p = self.profile
        start, end = (p.image.start, p.image.end) if p.image is not None else (None, None)
        return tuple(t for t in (p.image_token, start, end) if t is not None)

    def tiny_model(self, *, token_ids: dict[str, int], vocab_size: int, **kw: Any) -> torch.nn.Module:
        """A tiny random-weight fp32 model of ``model_class`` (train mode), built from a config offline.

        ``token_ids`` maps each of ``model_tokens()`` to its id in a ``vocab_size`` vocabulary; ``kw`` sizes
        the language model (``tiny_text_config``). The base builds a causal LM: ``model_class="LlamaForCausalLM"``
        picks another. Seed torch first for reproducible weights.

            get_profile("text").proof().tiny_model(token_ids={}, vocab_size=256)   # a 2-layer Qwen2ForCausalLM
        """
        import transformers

        name = kw.pop("model_class", None) or self.model_class
        if name is None:
            raise ConfigError(f"profile {self.profile.name!r} names no transformers model class to check against")
        cls = getattr(transformers, name)
        config = cls.config_class(**tiny_text_config(vocab_size=vocab_size, **kw), attn_implementation="sdpa")
        return cls(config).float().train()

    # ------------------------------------------------------------------ one path alone

    def path_inputs(
        self, batch: Mapping[str, Any], token_ids: dict[str, int]
    ) -> Callable[[torch.Tensor], dict[str, Any]]:
        """A function of one path's row positions ``tokens`` (L,) -> the model's kwargs that run that path
        alone with the model's own defaults: its ids, its images (``image_inputs`` entries of the images that
        start on it, in token order, through ``reference_inputs``)."""
        ids = batch["input_ids"][0]
        images = self.image_table(batch, token_ids)
        pixels = self.image_inputs(dict(batch), num_tokens=[n for _, n in images]) if images else []

        def inputs(tokens: torch.Tensor) -> dict[str, Any]:
            inside = [pixels[i] for i, (off, _) in enumerate(images) if bool((tokens == off).any())]
            return self.reference_inputs(ids[tokens][None], inside, token_ids=token_ids)

        return inputs

    def image_table(self, batch: Mapping[str, Any], token_ids: dict[str, int]) -> list[tuple[int, int]]:
        """(first token, token count) of every image in the batch: the run of placeholders at its offset."""
        if self.profile.image is None or batch.get("image_offsets") is None:
            return []
        image_id = token_ids.get(self.profile.image_token)
        ids = batch["input_ids"][0]
        out = []
        for off in batch["image_offsets"].tolist():
            run = (ids[off:] != image_id).nonzero()
            out.append((off, int(run[0]) if run.numel() else ids.numel() - off))
        return out

    def image_inputs(self, batch: dict[str, Any], *, num_tokens: list[int]) -> list[dict[str, torch.Tensor]]:
        """The batch's vision inputs cut per image, in batch order: what each image alone gives the model.

        ``num_tokens`` are the images' placeholder counts. The base cuts every vision key of ``forward_keys``
        into one leading entry per image (LLaVA's ``pixel_values`` (N, 3, 336, 336)); a family whose images
        take several entries (patches, tiles) overrides it.
        """
        keys = [k for k in self.profile.forward_keys
                if k not in ("input_ids", "position_ids") and batch.get(k) is not None]
        return [{k: batch[k][i : i + 1] for k in keys} for i in range(len(num_tokens))]

    def reference_inputs(
        self, input_ids: torch.Tensor, images: list[dict[str, torch.Tensor]], *, token_ids: dict[str, int]
    ) -> dict[str, Any]:
        """Model kwargs that run ``input_ids`` (1, L), one root-to-leaf path, alone with the model's own defaults
        (its positions, its attention), given the path's images (``image_inputs`` entries, in token order)."""
        out: dict[str, Any] = {"input_ids": input_ids, "use_cache": False}
        for key in images[0] if images else ():
            out[key] = torch.cat([im[key] for im in images])
        return out
