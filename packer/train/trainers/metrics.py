"""Per-source metrics of a mixed build (ms-swift's ``enable_channel_loss``): each source's loss, tokens, loss
tokens and examples per optimizer step, summed over the step's micro-batches and reduced over ranks.

``SourceMetrics`` sums what ``packed_cross_entropy`` computed (no second pass over the logits): per source, its
summed weighted token loss and summed loss weight (so ``loss/<source>`` is the source's weighted token mean over
the step, whatever normalization trains), its tokens, loss tokens and examples (fillers excluded). The sums are a
(S, 5) float64 tensor whose rows are the build's sources in the manifest's order, the same on every rank, so one
``all_reduce`` reduces them. ``SourceMetricsCallback`` does that at every step's end (every rank calls it) and adds
the means since the last log to the Trainer's logs:

    loss/chat  tokens/chat  loss_tokens/chat  examples/chat  loss/captions ...   (tokens and counts per step)

The trainers of ``packer.train.trainers.trainer`` and ``packer.train.trainers.trl`` install it for a mixed build (``source_metrics``);
a plain loop calls ``SourceMetrics.add`` after each micro-batch and ``step()`` after each optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from packer.errors import ConfigError
from packer.train.attention.layout import PackedLayout
from packer.train.trainers.loss import PackedLoss

FIELDS = ("loss_sum", "loss_weight", "tokens", "loss_tokens", "examples")


class SourceMetrics:
    """Per-source sums of the current step, and the reduced steps not yet logged.

    Args:
        sources: the build's source names, in the manifest's order (``build_sources``); the same on every rank.
    """

    def __init__(self, sources: Sequence[str]):
        self.names = list(sources)
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"source names must be distinct, got {self.names}")
        self.index = {n: i for i, n in enumerate(self.names)}
        self.current = torch.zeros(len(self.names), len(FIELDS), dtype=torch.float64)
        self.pending: list[torch.Tensor] = []  # reduced steps since the last log

    def add(self, out: PackedLoss, labels: torch.Tensor, layout: PackedLayout, sources: Sequence[str],
            filler: torch.Tensor | None = None) -> None:
        """Add one micro-batch: ``out`` from ``packed_cross_entropy`` on it, its layout and each example's source."""
        E = layout.num_examples
        if len(sources) != E:
            raise ConfigError(f"{len(sources)} example sources for {E} examples")
        try:
            src = torch.tensor([self.index[s] for s in sources], dtype=torch.long)  # (E,)
        except KeyError as e:
            raise ConfigError(f"example source {e.args[0]!r} is not one of the build's sources {self.names}") from e
        real = torch.ones(E, dtype=torch.bool) if filler is None else ~filler.cpu().bool()
        lengths = (layout.cu_seqlens[1:] - layout.cu_seqlens[:-1]).double().cpu()  # (E,)
        S = len(self.names)
        add = torch.zeros(S, len(FIELDS), dtype=torch.float64)
        add[:, 2] = torch.zeros(S, dtype=torch.float64).index_add(0, src[real], lengths[real])
        add[:, 4] = torch.bincount(src[real], minlength=S).double()
        if out.token_losses is not None and out.token_losses.numel():
            ex = out.token_examples.cpu()
            tok_src = src[ex]  # (L,)
            w = out.token_weights.detach().double().cpu()
            add[:, 0] = torch.zeros(S, dtype=torch.float64).index_add(0, tok_src, w * out.token_losses.detach().double().cpu())
            add[:, 1] = torch.zeros(S, dtype=torch.float64).index_add(0, tok_src, w)
            add[:, 3] = torch.bincount(tok_src, minlength=S).double()
        self.current += add

    def step(self, *, reduce: bool = True) -> torch.Tensor:
        """End a step: its sums, summed over ranks (torch.distributed, when initialized and ``reduce``), kept
        for the next ``logs()``; returns them (S, 5)."""
        sums, self.current = self.current, torch.zeros_like(self.current)
        import torch.distributed as dist

        if reduce and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else sums.device
            sums = sums.to(dev)
            dist.all_reduce(sums)
            sums = sums.cpu()
        self.pending.append(sums)
        return sums

    def logs(self) -> dict[str, float]:
        """The steps since the last call: each source's weighted token-mean loss over them, and its tokens, loss
        tokens and examples per step (means). Empty when no step ended since."""
        if not self.pending:
            return {}
        steps = torch.stack(self.pending)  # (K, S, 5)
        self.pending = []
        total = steps.sum(0)
        out: dict[str, float] = {}
        for i, name in enumerate(self.names):
            label = name or "default"
            if total[i, 1] > 0:
                out[f"loss/{label}"] = float(total[i, 0] / total[i, 1])
            out[f"tokens/{label}"] = float(total[i, 2]) / len(steps)
            out[f"loss_tokens/{label}"] = float(total[i, 3]) / len(steps)
            out[f"examples/{label}"] = float(total[i, 4]) / len(steps)
        return out


def build_sources(path: Any, storage_options: dict[str, Any] | None = None) -> list[str]:
    """A build's source names, in its config's order (``BuildConfig.sources``)."""
    from packer.shards.io import open_shards

    return [s.name for s in open_shards(path, storage_options=storage_options).manifest.config.sources]


class SourceMetricsCallback(TrainerCallback):
    """A transformers ``TrainerCallback``: at each step's end (on every rank) reduce ``metrics``' step over ranks;
    at each log add its per-source means to the logs (and to the log history entry just written)."""

    def __init__(self, metrics: SourceMetrics):
        self.metrics = metrics

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        self.metrics.step()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if logs is None or "loss" not in logs:  # a training log (not eval or the final summary)
            return
        extra = self.metrics.logs()
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)
