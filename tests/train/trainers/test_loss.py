"""packer.train.trainers.loss: exact packed cross-entropy, weighting, normalization across micro-batches."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from packer.core.types import IGNORE_INDEX
from packer.errors import ConfigError, ShardError
from packer.train.attention.layout import PackedLayout
from packer.train.trainers.loss import logits_to_keep, packed_cross_entropy
from tests.helpers import GOLDEN_LAYOUT, random_layout


def _labels(T: int, loss_positions: list[int], vocab: int = 11) -> torch.Tensor:
    labels = torch.full((1, T), IGNORE_INDEX)
    for t in loss_positions:
        labels[0, t] = (3 * t + 1) % vocab
    return labels


def _meta(layout: dict) -> dict:
    return {"cu_seqlens": torch.tensor(layout["cu_seqlens"], dtype=torch.int32),
            "node_offsets": torch.tensor(layout["node_offsets"], dtype=torch.int32),
            "node_parents": torch.tensor(layout["node_parents"], dtype=torch.int32)}


def test_tree_loss_by_hand():
    """Each target once, from its predecessor's logit; a0 and b0 both read P2's logit."""
    torch.manual_seed(0)
    logits = torch.randn(1, 10, 11, requires_grad=True)
    loss_at = [1, 3, 5, 6, 9]  # P1, a0 (branch start), b0 (branch start), b1, Q1
    labels = _labels(10, loss_at)
    out = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT))
    pred = {1: 0, 3: 2, 5: 2, 6: 5, 9: 8}
    expected = sum(F.cross_entropy(logits[0, pred[t]], labels[0, t]) for t in loss_at)
    torch.testing.assert_close(out.loss, expected)
    assert int(out.count) == int(out.num_loss_tokens) == 5
    g = torch.autograd.grad(out.loss, logits)[0]
    g_ref = torch.autograd.grad(expected, logits)[0]
    torch.testing.assert_close(g, g_ref)
    assert g[0, 2].abs().sum() > 0 and g[0, 1].abs().sum() == 0  # P2 feeds two targets, P1 feeds none


def test_reductions_and_accuracy():
    torch.manual_seed(1)
    logits = torch.randn(10, 11)
    labels = _labels(10, [1, 3, 5, 6, 9])
    s = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="sum")
    m = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="mean")
    n = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="none")
    torch.testing.assert_close(m.loss, s.loss / 5)
    assert n.loss.shape == (10,) and n.loss[[0, 2, 4, 7, 8]].abs().sum() == 0
    torch.testing.assert_close(n.loss.sum(), s.loss)
    pred = {1: 0, 3: 2, 5: 2, 6: 5, 9: 8}
    hits = sum(int(logits[pred[t]].argmax() == labels[0, t]) for t in pred)
    assert int(s.num_correct) == hits and float(s.accuracy) == pytest.approx(hits / 5)


def test_example_weighting_uses_segment_ids():
    """Each example's mean, averaged over examples; never the packed row's token mean."""
    torch.manual_seed(2)
    logits = torch.randn(10, 11)
    labels = _labels(10, [1, 3, 5, 6, 9])  # example 0 has 4 loss tokens, example 1 has 1
    tok = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="none").loss
    ex = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="mean", weighting="example")
    expected = (tok[[1, 3, 5, 6]].mean() + tok[9]) / 2
    torch.testing.assert_close(ex.loss, expected)
    assert int(ex.count) == 2
    summed = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT), reduction="sum", weighting="example")
    torch.testing.assert_close(summed.loss / summed.count, expected)


def test_token_mean_over_micro_batches_is_packing_invariant():
    """sum of sums / sum of counts over two micro-batches == the token mean of everything at once."""
    torch.manual_seed(3)
    layout = random_layout(random.Random(3), examples=6)
    T = layout["num_tokens"]
    pred = PackedLayout.from_tensors(**layout).predecessors()
    loss_at = [t for t in range(T) if pred[t] >= 0 and t % 2 == 0]
    logits, labels = torch.randn(T, 11), _labels(T, loss_at)
    whole = packed_cross_entropy(logits, labels, _meta(layout), reduction="mean")
    cut = layout["cu_seqlens"][3]  # split the row between examples 2 and 3
    first = {"cu_seqlens": layout["cu_seqlens"][:4],
             "node_offsets": [o for o in layout["node_offsets"] if o < cut],
             "node_parents": layout["node_parents"][: sum(o < cut for o in layout["node_offsets"])]}
    k = len(first["node_offsets"])
    second = {"cu_seqlens": [c - cut for c in layout["cu_seqlens"][3:]],
              "node_offsets": [o - cut for o in layout["node_offsets"][k:]],
              "node_parents": [p - k if p >= 0 else -1 for p in layout["node_parents"][k:]]}
    parts = [packed_cross_entropy(logits[:cut], labels[:, :cut], _meta(first)),
             packed_cross_entropy(logits[cut:], labels[:, cut:], _meta(second))]
    total = sum(p.loss for p in parts) / sum(p.count for p in parts)
    torch.testing.assert_close(total, whole.loss)


def test_logits_to_keep_gives_the_same_loss():
    torch.manual_seed(4)
    logits = torch.randn(1, 10, 11)
    labels = _labels(10, [1, 3, 5, 6, 9])
    keep = logits_to_keep(labels, _meta(GOLDEN_LAYOUT))
    assert keep.tolist() == [0, 2, 5, 8]  # P2's row once for both branch starts
    full = packed_cross_entropy(logits, labels, _meta(GOLDEN_LAYOUT))
    part = packed_cross_entropy(logits[:, keep], labels, _meta(GOLDEN_LAYOUT), logits_index=keep)
    torch.testing.assert_close(part.loss, full.loss)
    with pytest.raises(ConfigError, match="logits_to_keep"):
        packed_cross_entropy(logits[:, keep[:2]], labels, _meta(GOLDEN_LAYOUT), logits_index=keep[:2])


def test_layout_object_and_bad_arguments():
    logits, labels = torch.randn(10, 11), _labels(10, [1])
    layout = PackedLayout.from_tensors(**GOLDEN_LAYOUT)
    packed_cross_entropy(logits, labels, layout)  # a PackedLayout works as the metadata too
    with pytest.raises(ConfigError, match="'reduction' must be one of"):
        packed_cross_entropy(logits, labels, layout, reduction="avg")
    with pytest.raises(ConfigError, match="'weighting' must be one of"):
        packed_cross_entropy(logits, labels, layout, weighting="sample")
    with pytest.raises(ShardError, match="no predecessor"):
        packed_cross_entropy(logits, _labels(10, [0, 1]), layout)
    with pytest.raises(ShardError, match="labels have 9 tokens"):
        packed_cross_entropy(logits[:9], labels[:, :9], layout)


def test_linear_pack_equals_transformers_loss_with_shift_labels():
    """HF's ForCausalLMLoss with the collate's shift_labels is exact on a linear pack."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(5)
    cu = [0, 4, 5, 9]
    meta = {"cu_seqlens": torch.tensor(cu, dtype=torch.int32)}
    labels = _labels(9, [1, 2, 3, 6, 8])
    shift = torch.full_like(labels, IGNORE_INDEX)
    shift[:, :-1] = labels[:, 1:]
    logits = torch.randn(1, 9, 11)
    hf = ForCausalLMLoss(logits, labels=None, vocab_size=11, shift_labels=shift)
    ours = packed_cross_entropy(logits, labels, meta, reduction="mean")
    torch.testing.assert_close(hf, ours.loss)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("weighting", "prefix"), [("token", "once"), ("example", "once"), ("sqrt", "path")])
def test_cpu_labels_with_cuda_logits_equal_cuda_labels(weighting, prefix):
    """The collator's CPU labels select the loss tokens on the host (no stream sync): the same loss, count and
    gradient as labels on the GPU, for a tree layout and every normalization path."""
    torch.manual_seed(0)
    logits = torch.randn(1, 10, 11, device="cuda", requires_grad=True)
    labels = _labels(10, [1, 3, 5, 6, 9])
    weights = torch.rand(1, 10) + 0.5
    layout = PackedLayout.from_tensors(10, GOLDEN_LAYOUT["cu_seqlens"], GOLDEN_LAYOUT["node_offsets"],
                                       GOLDEN_LAYOUT["node_parents"])
    got = packed_cross_entropy(logits, labels, layout, weighting=weighting, prefix=prefix, loss_weights=weights)
    ref = packed_cross_entropy(logits, labels.cuda(), layout, weighting=weighting, prefix=prefix,
                               loss_weights=weights.cuda())
    assert got.loss.device.type == "cuda" and got.count.device.type == "cuda"
    torch.testing.assert_close(got.loss, ref.loss, rtol=0, atol=0)
    torch.testing.assert_close(got.count, ref.count, rtol=0, atol=0)
    g = torch.autograd.grad(got.loss, logits)[0]
    torch.testing.assert_close(g, torch.autograd.grad(ref.loss, logits)[0], rtol=0, atol=0)


def test_loss_targets_go_to_the_device_asked():
    """``loss_targets(device=)`` puts the selection where the logits are, whatever device the labels are on."""
    from packer.train.trainers.loss import loss_targets

    labels = _labels(10, [1, 3, 5, 6, 9])
    sel = loss_targets(labels, _meta(GOLDEN_LAYOUT), device="meta")
    assert {t.device.type for t in (sel.positions, sel.predecessors, sel.targets, sel.examples)} == {"meta"}
    cpu = loss_targets(labels, _meta(GOLDEN_LAYOUT))
    assert cpu.predecessors.tolist() == [0, 2, 2, 5, 8] and cpu.targets.tolist() == labels[0, [1, 3, 5, 6, 9]].tolist()
