"""``packer stats`` per source (issue 24): each source's share of tokens, of the (weighted) loss tokens and of the
packs, computed by hand on a small plan; the weighted loss-token total where weights are not all 1."""

from __future__ import annotations

import numpy as np
import pytest

from packer.report.stats import compute_stats, format_stats


def test_source_shares_and_weighted_loss_tokens():
    lengths = np.array([10, 20, 30, 40])
    pack_ids = np.array([0, 0, 1, 2])
    sources = np.array(["a", "b", "b", "a"])
    loss = np.array([2, 4, 6, 8])
    weight = np.array([1.0, 2.0, 6.0, 4.0])  # the examples' summed loss weights (a: 5, b: 8)
    stats = compute_stats(lengths=lengths, vision=np.zeros(4, np.int64), pack_ids=pack_ids, capacity=64,
                          loss_tokens=loss, loss_weight=weight, sources=sources)
    a, b = stats["sources"]["a"], stats["sources"]["b"]
    assert a["token_share"] == pytest.approx(50 / 100) and b["token_share"] == pytest.approx(50 / 100)
    assert a["loss_tokens"] == 10 and b["loss_tokens"] == 10
    assert a["loss_token_share"] == pytest.approx(5 / 13) and b["loss_token_share"] == pytest.approx(8 / 13)
    assert (a["packs"], b["packs"]) == (2, 2) and a["pack_share"] == pytest.approx(2 / 3)
    assert stats["weighted_loss_tokens"] == pytest.approx(13.0)
    table = format_stats(stats)
    assert "weighted 13.0" in table and "38.46% of loss tokens (weighted), in 2 packs (66.67%)" in table
    unweighted = compute_stats(lengths=lengths, vision=np.zeros(4, np.int64), pack_ids=pack_ids, capacity=64,
                               loss_tokens=loss, loss_weight=loss.astype(float), sources=sources)
    assert "weighted_loss_tokens" not in unweighted
    assert unweighted["sources"]["a"]["loss_token_share"] == pytest.approx(10 / 20)
