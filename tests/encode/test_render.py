"""``render.stage``'s per-node lists (made as the ChatML renderer renders, else in one walk over the messages) and its
image planning (``_plan_images`` for a rule without blocks) against the general derivation they replace: each
node's loss spans and weights from its messages (``labels.carries_loss`` / ``loss_weight``), its media parts, and
``rewrite_images``' planning (the same first error, the same sizes), on random records."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.core.types import Example, ImageRef
from packer.encode import render
from packer.encode.labels import carries_loss, loss_weight
from packer.errors import RecordError
from tests.encode.helpers import parse_all
from tests.encode.test_encoder import IMAGES, record


def general_lists(s: render.Staged) -> tuple[list, list, list]:
    """Each node's loss spans, weights and media parts as ``batch_tokens`` and the batch finish derived them."""
    loss, weights, media = [], [], []
    for i, node in enumerate(s.nodes):
        own = s.spans[i][-len(node.messages):]
        loss.append([sp for sp, m in zip(own, node.messages, strict=True) if carries_loss(m)])
        weights.append([loss_weight(m) for m in node.messages if carries_loss(m)])
        media.append([p for m in node.messages for p in m.parts if not isinstance(p, str)])
    return loss, weights, media


def staged_or_error(example: Example, encoder, rewrite: bool) -> render.Staged | tuple[str, str]:
    real = render._plan_images
    if rewrite:  # the general path's planning: rewrite_images over every path
        render._plan_images = lambda s, paths, token, rule: render._rewrite_images(s, paths, encoder.profile)
    try:
        return render.stage(example, encoder._chat, encoder.profile)
    except RecordError as e:
        return (e.reason, str(e))
    finally:
        render._plan_images = real


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(records=st.lists(record(), min_size=1, max_size=8), name=st.sampled_from(["qwen2-vl", "llava", "text"]),
       missing=st.booleans())
def test_stage_lists_equal_the_general_derivation(encoders, image_root, records, name, missing):
    encoder = encoders[name]
    gone = image_root / "img" / "gone.jpg"
    if missing:  # an image deleted after parsing: planned (and refused) where rewrite_images plans it
        shutil.copy(image_root / "img" / IMAGES[0], gone)
        records = [*records, {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/gone.jpg"},
                                                                         {"type": "text", "text": "Q"}]}, {"role": "assistant", "content": "?"}]}]
    examples = [p for p in parse_all(records, image_root) if isinstance(p, Example)]
    gone.unlink(missing_ok=True)
    for example in examples:
        got, want = staged_or_error(example, encoder, False), staged_or_error(example, encoder, True)
        if isinstance(want, tuple) or isinstance(got, tuple):
            assert got == want
            continue
        assert (got.texts, got.spans) == (want.texts, want.spans)
        loss, weights, media = general_lists(got)
        assert got.loss == loss and got.media == media
        assert got.weights == (weights if any(w != 1.0 for ws in weights for w in ws) else None)
        refs = [p for n in got.nodes for m in n.messages for p in m.parts if isinstance(p, ImageRef)]
        assert all(size == encoder.profile.image.plan(ref) for ref in refs if (size := got.sizes.get(id(ref))))
        if any(encoder.profile.image_token in t for t in got.texts if encoder.profile.image_token):
            assert {id(r) for r in refs} <= got.sizes.keys()  # every image the renderings name is planned


@pytest.mark.parametrize("weights", [[0.5], [1.0, 2.0], [True, 0.25]])
def test_stage_lists_of_weighted_messages(encoders, image_root, weights):
    """A node with a loss weight other than 1 is listed the general way: every node's weights, in order."""
    msgs = []
    for w in weights:
        msgs += [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "loss": w}]
    (example,) = parse_all([{"messages": msgs}], image_root)
    s = render.stage(example, encoders["qwen2-vl"]._chat, encoders["qwen2-vl"].profile)
    loss, want, media = general_lists(s)
    assert s.loss == loss and media == [[]]
    assert s.weights == (want if any(w not in (1.0, True) for w in weights) else None)


def test_stage_plans_where_rewrite_images_plans(encoders, image_root):
    """An image deleted after parsing: ``stage`` refuses it as the general path's planning does (not vacuous)."""
    gone = image_root / "img" / "gone2.jpg"
    shutil.copy(image_root / "img" / IMAGES[0], gone)
    (example,) = parse_all([{"messages": [{"role": "user", "content": [{"type": "image", "image": "img/gone2.jpg"}]},
                                          {"role": "assistant", "content": "?"}]}], image_root)
    gone.unlink()
    got = staged_or_error(example, encoders["qwen2-vl"], False)
    assert isinstance(got, tuple) and got == staged_or_error(example, encoders["qwen2-vl"], True)
