#!/usr/bin/env python
"""Cost of packer's linear-state path (packer.train.attention.linear_state) on CPU, against running each example alone.

    python scripts/bench_linear_state.py [--threads 1] [--repeats 3]

One Qwen3.5 Gated DeltaNet layer (hidden 1024, 8 key / 16 value heads of 64, conv kernel 4: a small Qwen3.5
layer at a quarter of the released head dims, random weights, fp32), forward + backward, best of ``--repeats``,
on three rows:

- ``text``: 8 linear examples (lengths 64 .. 512, 2048 tokens);
- ``caption trees``: 7 trees, a 270-token prefix with 5 branches of 18 (2520 tokens; docs/training.md's row);
- ``nested trees``: 4 trees of 3 levels (prefix 300, 3 branches of 100, each with 2 of 40: 3360 tokens).

Columns, all measured in this run: ``packed`` (packer's tree path on the row), ``alone`` (transformers' own
torch forward on every root-to-leaf path alone, summed: what training unpacked costs), ``row, leaking``
(transformers' forward over the whole row as one sequence: the cost floor, and wrong), and the ratios.
Prints one JSON line per row, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packer.train.attention.layout import PackedLayout  # noqa: E402
from packer.train.attention.linear_state import LAYOUT_KWARG, install  # noqa: E402


def rows() -> dict[str, tuple[int, list[int], list[int], list[int]]]:
    """name -> (T, cu_seqlens, node_offsets, node_parents)."""
    out = {}
    lens = [64, 512, 128, 384, 256, 192, 320, 192]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    out["text"] = (cu[-1], cu, cu[:-1], [-1] * len(lens))

    def trees(count, build):
        offsets, parents, cu, t = [], [], [0], 0
        for _ in range(count):
            t = build(offsets, parents, t)
            cu.append(t)
        return t, cu, offsets, parents

    def caption(offsets, parents, t):
        root = len(offsets)
        offsets.append(t), parents.append(-1)
        t += 270
        for _ in range(5):
            offsets.append(t), parents.append(root)
            t += 18
        return t

    def nested(offsets, parents, t):
        root = len(offsets)
        offsets.append(t), parents.append(-1)
        t += 300
        for _ in range(3):
            mid = len(offsets)
            offsets.append(t), parents.append(root)
            t += 100
            for _ in range(2):
                offsets.append(t), parents.append(mid)
                t += 40
        return t

    out["caption trees"] = trees(7, caption)
    out["nested trees"] = trees(4, nested)
    return out


def best(fn, repeats: int) -> float:
    fn()  # warm-up (allocations, caches on the layout)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers.utils import logging

    logging.set_verbosity_error()  # the "falling back to torch" notice: that fallback is what is measured
    config = Qwen3_5TextConfig(hidden_size=1024, linear_num_key_heads=8, linear_num_value_heads=16,
                               linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                               num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(config, 0).float()

    class Wrap(torch.nn.Module):  # install() walks a model
        def __init__(self):
            super().__init__()
            self.layer = layer

    install(Wrap())
    results = []
    for name, (T, cu, offsets, parents) in rows().items():
        layout = PackedLayout.from_tensors(T, cu, offsets, parents)
        x = torch.randn(1, T, config.hidden_size, requires_grad=True)
        ranges = list(zip(offsets, offsets[1:] + [T], strict=True))
        has_child = set(p for p in parents if p >= 0)
        anc = layout.ancestors()
        paths = [torch.cat([torch.arange(*ranges[m]) for m in anc[n].nonzero().reshape(-1).tolist()])
                 for n in range(len(offsets)) if n not in has_child]
        path_tokens = sum(len(p) for p in paths)

        def packed(x=x, layout=layout):
            layer(x, **{LAYOUT_KWARG: layout}).sum().backward()

        def alone(x=x, paths=paths):
            for p in paths:
                layer(x[:, p].detach().requires_grad_()).sum().backward()

        def leaking(x=x):
            layer(x).sum().backward()

        t_packed, t_alone, t_row = best(packed, args.repeats), best(alone, args.repeats), best(leaking, args.repeats)
        r = {"row": name, "tokens": T, "examples": len(cu) - 1, "paths": len(paths), "path_tokens": path_tokens,
             "packed_ms": round(1e3 * t_packed, 1), "alone_ms": round(1e3 * t_alone, 1),
             "row_leaking_ms": round(1e3 * t_row, 1), "packed_over_alone": round(t_packed / t_alone, 3),
             "packed_over_leaking": round(t_packed / t_row, 3), "threads": args.threads,
             "loadavg": round(os.getloadavg()[0], 2)}
        print(json.dumps(r))
        results.append(r)
    print()
    print("| row | tokens (path tokens) | packed | each path alone | row, leaking | packed / alone | packed / leaking |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['row']} ({r['examples']} examples, {r['paths']} paths) | {r['tokens']} ({r['path_tokens']}) | "
              f"{r['packed_ms']} ms | {r['alone_ms']} ms | {r['row_leaking_ms']} ms | {r['packed_over_alone']} | "
              f"{r['packed_over_leaking']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
