"""transformers integration: a stock Hugging Face model trains on packed rows with no model code changes.

``use_packed_attention(model)`` registers packer's backends in ``AttentionInterface`` (names "packer" for
auto and "packer_<backend>"), switches the model to one, and adds a forward pre-hook so that
``model(**collate(rows))`` works as it is. ``model_inputs(batch)`` is the explicit form: the kwargs of
``model(**kwargs)``, with the batch's ``PackedLayout`` riding under ``packer_layout`` to every attention call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from packer.errors import ConfigError
from packer.models import forward_keys
from packer.train.attention import linear_state
from packer.train.attention.backends import BACKENDS, packed_attention
from packer.train.attention.layout import PackedLayout
from packer.train.keys import (  # noqa: F401 - re-exported: the collator and trainers import them from here
    BOOKKEEPING_KWARGS,
    EXAMPLES_KWARG,
    FILLER_KWARG,
    LAYOUT_KWARG,
    SOURCES_KWARG,
    WEIGHTS_KWARG,
)
from packer.train.options import Backend, check

IMPLEMENTATION_PREFIX = "packer"  # transformers attn_implementation names: "packer" (auto), "packer_sdpa", ...


_RAW_LAYOUT: tuple | None = None  # (cu_seqlens, node_offsets, node_parents, spans, T, layout) of the last raw batch


def _layout_from_kwargs(kwargs: dict, num_tokens: int) -> PackedLayout | None:
    """The layout riding in the attention kwargs: ``packer_layout`` (from ``model_inputs``), or the raw
    collated keys ``cu_seqlens`` / ``node_offsets`` / ``node_parents`` / ``bidirectional_spans`` of
    ``model(**batch)``."""
    global _RAW_LAYOUT
    layout = kwargs.get(LAYOUT_KWARG)
    if layout is not None:
        return layout
    cu = kwargs.get("cu_seqlens")
    if not isinstance(cu, torch.Tensor):
        return None
    offsets, parents, spans = kwargs.get("node_offsets"), kwargs.get("node_parents"), kwargs.get("bidirectional_spans")
    # Every layer receives the same tensor objects: identity keeps one layout (and its caches) per forward.
    last = _RAW_LAYOUT
    key = (cu, offsets, parents, spans)
    if last is not None and all(a is b for a, b in zip(last[:4], key, strict=True)) and last[4] == num_tokens:
        return last[5]
    layout = PackedLayout.from_tensors(num_tokens, cu, offsets, parents, bidirectional_spans=spans)
    _RAW_LAYOUT = (cu, offsets, parents, spans, num_tokens, layout)
    return layout


def _check_not_packed(position_ids: Any) -> None:
    """A causal call without packer metadata is one plain sequence; refuse a row whose positions restart,
    which would otherwise attend across examples silently."""
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() >= 1 and position_ids.shape[-1] > 1:
        pos = position_ids.reshape(-1, position_ids.shape[-1])[0]
        if bool((pos[1:] != pos[:-1] + 1).any()):
            raise ConfigError(
                "a packed row reached a packer attention backend without its boundaries: call "
                "model(**packer.train.attention.hf.model_inputs(batch)) (or pass cu_seqlens/node_offsets/node_parents)"
            )


def make_attention_function(backend: Backend):
    """An ``AttentionInterface`` function running ``backend`` ("auto" or one of ``BACKENDS``)."""

    def packer_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """transformers calls this with query (B, H, T, D), key/value (B, Hkv, T, D); returns (B, T, H, D)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        layout = _layout_from_kwargs(kwargs, query.shape[2]) if causal else None
        window = kwargs.get("sliding_window")  # a sliding-window layer's (Gemma 3, Mistral): along each path
        chunk = attention_chunk(module) if causal else None  # a chunked-attention layer's (Llama 4): along each path
        if layout is None or query.shape[2] != layout.num_tokens:
            # Not a packed text call: a vision tower's per-image attention (non-causal), or one plain sequence.
            if causal and attention_mask is None:
                _check_not_packed(kwargs.get("position_ids"))
                if (window is not None or chunk is not None) and query.shape[2] == key.shape[2]:
                    # No cache and no mask: this implementation's mask hook builds none without an attention_mask
                    # (packed rows carry none), so a local layer's pattern is applied here, explicitly. With a
                    # cache, transformers gives a mask unless the pattern is plain causal (generate passes one).
                    local = _local_mask(query.shape[2], window, chunk, query.device)
                    return sdpa_attention_forward(module, query, key, value, local, dropout=dropout, scaling=scaling,
                                                  is_causal=False, **kwargs)
            bounds = kwargs.get("cu_seq_lens_q")
            if not causal and attention_mask is None and bounds is not None:
                # A vision tower under a flash-named implementation (packer_flash) passes its images' boundaries
                # and no mask (Qwen2-VL's and Pixtral's towers): each image attends within itself only.
                return _per_segment(module, query, key, value, bounds, dropout=dropout, scaling=scaling), None
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
            )
        if query.shape[0] != 1:
            raise ConfigError(f"packed attention takes one concatenated row (batch size 1), got {query.shape[0]}")
        if attention_mask is not None:
            raise ConfigError("pass packer boundaries or an attention_mask, not both: drop 'attention_mask'")
        q = _path_temperature(module, query[0], layout).transpose(0, 1)  # (T, H, D)
        k = key[0].transpose(0, 1)  # (T, Hkv, D)
        v = value[0].transpose(0, 1)  # (T, Hkv, D)
        out = packed_attention(q, k, v, layout, backend=backend, scale=scaling, dropout=dropout, window=window,
                               chunk=chunk)
        return out.unsqueeze(0), None  # (1, T, H, D)

    packer_attention_forward.__name__ = f"packer_{backend}_attention_forward"
    return packer_attention_forward


def attention_chunk(module: torch.nn.Module) -> int | None:
    """The chunk of a chunked-attention layer, else None: Llama 4's RoPE layers (``config.layer_types[layer_idx] ==
    "chunked_attention"``, ``config.attention_chunk_size``), which transformers tells its attention function
    nothing about (their mask carries the chunks, and packer builds none). ConfigError where a model has chunked
    layers but the module does not say which it is (no ``layer_idx``), or names no chunk size."""
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    if not types or "chunked_attention" not in types:
        return None
    idx = getattr(module, "layer_idx", None)
    if idx is None:
        raise ConfigError(f"{type(module).__name__} is an attention layer of a model with chunked-attention layers but "
                          "names no layer_idx: packer cannot tell whether its keys are cut into chunks")
    if types[idx] != "chunked_attention":
        return None
    size = getattr(config, "attention_chunk_size", None)
    if not size:
        raise ConfigError(f"layer {idx} is chunked_attention but the config's attention_chunk_size is {size!r}")
    return int(size)


def _path_temperature(module: torch.nn.Module, query: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """Llama 4's NoPE layers with temperature tuning (``Llama4TextAttention``: ``attn_temperature_tuning`` and not
    ``use_rope``) scale each query by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1, p the token's index in
    the row (``torch.arange``, not its position id): on a packed row p must be its position on its own path, as run
    alone. ``query`` (H, T, D) comes scaled by the row index; tokens whose two scales differ (only past floor_scale
    tokens into a row: 8,192 in the checkpoints) are rescaled to their path's, others are left as they are."""
    if not getattr(module, "attn_temperature_tuning", False) or getattr(module, "use_rope", True):
        return query
    floor_scale, attn_scale = module.floor_scale, module.attn_scale

    def ratio() -> torch.Tensor | None:  # (T,) path scale / row scale, once per batch; None where they agree
        def scale(p: torch.Tensor) -> torch.Tensor:  # the module's own expression
            return torch.log1p(torch.floor((p.float() + 1.0) / floor_scale)) * attn_scale + 1.0

        row, path = scale(torch.arange(layout.num_tokens)), scale(layout.path_positions())
        return None if bool((row == path).all()) else (path / row).to(query.device)

    r = layout._cached(("temperature", floor_scale, attn_scale, str(query.device)), ratio)
    return query if r is None else (query * r[None, :, None]).to(query.dtype)


def _local_mask(length: int, window: int | None, chunk: int | None, device: torch.device) -> torch.Tensor:
    """(1, 1, L, L) bool: one plain sequence's causal mask with a sliding window or chunks (transformers'
    ``sliding_window_overlay`` / ``chunked_overlay`` on positions 0 .. L-1)."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    if chunk is not None:
        mask &= torch.div(j, chunk, rounding_mode="floor") == torch.div(i, chunk, rounding_mode="floor")
    return mask[None, None]


def _per_segment(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 bounds: torch.Tensor, *, dropout: float, scaling: float | None) -> torch.Tensor:
    """Bidirectional attention within each [bounds[i], bounds[i+1]) of the sequence dimension: (B, T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cuts = bounds.tolist()
    outs = [
        sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, dropout=dropout,
                               scaling=scaling, is_causal=False)[0]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    return torch.cat(outs, dim=1)


def _mask_for_fallback(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """``AttentionMaskInterface`` entry: packed batches carry no attention_mask, so no (T, T) mask is built
    from position ids (which would be wrong for trees, and wasted); a padded unpacked batch gets sdpa's mask."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def implementation_name(backend: Backend = "auto") -> str:
    """The transformers ``attn_implementation`` name of a packer backend ("packer" for auto)."""
    if check("backend", backend, Backend) == "auto":
        return IMPLEMENTATION_PREFIX
    return f"{IMPLEMENTATION_PREFIX}_{backend}"


def register() -> list[str]:
    """Register every packer backend in transformers' AttentionInterface and AttentionMaskInterface.

    Names: "packer" (auto per device) and "packer_<backend>". Idempotent. Returns the names.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    names = []
    for backend in ("auto", *BACKENDS):
        name = implementation_name(backend)
        AttentionInterface.register(name, make_attention_function(backend))
        AttentionMaskInterface.register(name, _mask_for_fallback)
        names.append(name)
    return names


def attn_implementations(model: Any, name: str) -> str | dict[str, str]:
    """What ``model.set_attn_implementation`` takes to run ``name`` wherever a sub-model can: ``name``, or a dict
    keeping its own implementation for each sub-model whose class refuses ``name`` (Gemma 4's audio tower has only
    its eager chunked attention, and per-clip rows that packing never touches)."""
    keep = {}
    for key in getattr(model.config, "sub_configs", {}):
        sub_config = getattr(model.config, key, None)
        for module in model.modules():
            if getattr(module, "config", None) is sub_config and sub_config is not None and hasattr(module, "_supports_sdpa"):
                if not _supports_implementation(module, name):
                    keep[key] = sub_config._attn_implementation
                break
    return {"": name, **{k: name for k in model.config.sub_configs}, **keep} if keep else name


def _supports_implementation(module: Any, name: str) -> bool:
    if name == "eager":
        return True
    if name == "sdpa":
        return bool(module._supports_sdpa)
    if name.startswith("flash_attention"):
        return bool(module._supports_flash_attn)
    if name == "flex_attention":
        return bool(module._supports_flex_attn)
    # a registered AttentionInterface function (packer's): it stands in for any kernel call, so a model whose
    # layers call sdpa, flash or flex takes it even where it does not declare _supports_attention_backend (Qwen3.5)
    return any(bool(getattr(module, flag, False)) for flag in (
        "_supports_attention_backend", "_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn"))


def use_packed_attention(model: Any, backend: Backend = "auto") -> str:
    """Switch a stock transformers model (and its sub-models) to a packer backend; returns the name set.

    No model code changes: the model reads ``config._attn_implementation`` at every call. Vision towers
    (non-causal, per-image) fall through to SDPA inside the same function. A forward pre-hook lets the
    model take a collated batch as it is: ``model(**collate(rows))`` (see ``_packed_batch_hook``).

    Linear-state layers (Qwen3.5's Gated DeltaNet) have no mask to set: ``packer.train.attention.linear_state.install``
    routes each one through packer's tree path (conv windows along each path, recurrent state forked at each
    branch), and refuses a model with a stateful layer it does not know (``ConfigError``, naming it).
    """
    linear_state.install(model)
    register()
    name = implementation_name(backend)
    model.set_attn_implementation(attn_implementations(model, name))
    if not getattr(model, "_packer_hook", False):
        model.register_forward_pre_hook(_packed_batch_hook, with_kwargs=True)
        model._packer_hook = True
    return name


# Keys of a collated batch that are packer's bookkeeping, never model inputs.
_BATCH_ONLY = ("cu_seqlens", "max_seqlen", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
               "node_offsets", "node_parents", "num_loss_tokens", "example_ids", "image_offsets", "video_offsets",
               "audio_offsets",
               "packer_state", "bidirectional_spans", "num_rows", "num_filler_rows", "filler_examples")


def _packed_batch_hook(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook: ``model(**collate(rows))`` becomes ``model(**model_inputs(batch))``.

    A raw collated batch carries `cu_seqlens` / `max_seqlen`, which a transformers vision tower would pop as
    its *own* precomputed boundaries (silently wrong), and tree rows' `labels`, which the model's shifted
    loss would get wrong. So the hook moves the boundaries into ``packer_layout``, keeps labels only for
    linear rows (where ``shift_labels`` makes HF's loss exact), and leaves every other kwarg as given.
    """
    if LAYOUT_KWARG in kwargs:  # already converted (model_inputs, packer.train.trainers.trainer.PackedCollator)
        layout = kwargs[LAYOUT_KWARG]
        if not layout.is_linear and (kwargs.get("labels") is not None or kwargs.get("shift_labels") is not None):
            raise ConfigError(
                "a packed batch with message trees reached the model with labels: a model's (or TRL's) own loss "
                "scores labels shifted by one position, which is wrong at every branch start (a parent's last token "
                "predicts each child's first). Train it with packer's loss: packer.train.trainers.trainer.PackedTrainer, "
                "packer.train.trainers.trl.PackedSFTTrainer / PackedDPOTrainer, or packer.train.trainers.loss.packed_cross_entropy "
                "(docs/training.md, 'Trainers')"
            )
        if any(k in kwargs for k in BOOKKEEPING_KWARGS):  # a trainer's bookkeeping, never a model input
            kwargs = {k: v for k, v in kwargs.items() if k not in BOOKKEEPING_KWARGS}
        return args, kwargs
    if "cu_seqlens" not in kwargs or "node_parents" not in kwargs:
        return args, kwargs  # not a packer batch
    layout = PackedLayout.from_batch(kwargs)
    out = {k: v for k, v in kwargs.items() if k not in _BATCH_ONLY}
    if not layout.is_linear or "shift_labels" not in kwargs:
        out.pop("labels", None)
        out.pop("shift_labels", None)
    out.setdefault("use_cache", False)
    out[LAYOUT_KWARG] = layout
    return args, out


def model_inputs(
    batch: Mapping[str, Any],
    *,
    with_labels: bool = False,
    bidirectional_spans: Any = None,
) -> dict[str, Any]:
    """The kwargs of ``model(**kwargs)`` for a collated packed batch.

    Keeps the model's inputs (input_ids, position_ids, images), sets ``use_cache=False``, and adds the row's
    ``PackedLayout`` under ``packer_layout``; transformers forwards it untouched to every attention call. The
    layout takes the batch's ``bidirectional_spans`` (collate emits them for a profile with
    ``bidirectional_images``); an explicit ``bidirectional_spans=`` wins.
    With ``with_labels=True`` (linear packs only) ``labels`` and ``shift_labels`` are kept so the model's own
    loss is exact. Other keys (boundaries, counts, provenance) are dropped: a vision tower would read
    ``cu_seqlens`` / ``max_seqlen`` as its own.
    """
    layout = PackedLayout.from_batch(batch, bidirectional_spans=bidirectional_spans)
    # What the model takes (the model families' forward keys). Everything else stays out: targets and
    # bookkeeping (the loss is computed outside), and the boundary keys, which a vision tower would pop as its
    # own precomputed `cu_seqlens` / `max_seqlen` (transformers' vision_utils); they travel as packer_layout.
    out: dict[str, Any] = {k: batch[k] for k in forward_keys() if batch.get(k) is not None}
    out["use_cache"] = False
    out[LAYOUT_KWARG] = layout
    if with_labels:
        if "shift_labels" not in batch or not layout.is_linear:
            raise ConfigError(
                "with_labels=True needs a linear pack with 'shift_labels'; a tree row needs "
                "packer.train.trainers.loss.packed_cross_entropy (a parent's last logit feeds several targets)"
            )
        out["labels"] = batch["labels"]
        out["shift_labels"] = batch["shift_labels"]
    return out
