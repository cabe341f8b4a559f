"""TRL 1.16's SFTTrainer on packer's rows equals TRL on the unpacked examples: per-step losses and every gradient
(real TRL, real transformers Trainer, tiny real models, fp32; TRL's configs default to bf16, so bf16=False).

- The plain way, no packer argument: ``SFTTrainer(model, train_dataset=load_dataset(OUT)["train"],
  args=SFTConfig(padding_free=True, max_length=None))`` on a linear text build (the shards' ``seq_lengths``).
- What TRL cannot train alone is refused, never trained wrong: a tree build (TRL's own vision refusal, the null
  ``seq_lengths`` when the media columns are dropped by hand, packer's hook when TRL's loss meets a tree).
- The packer path inside TRL: ``PackedSFTTrainer`` on message trees (packer's loss, gradient accumulation), and on
  Qwen2-VL rows with COCO images (mRoPE positions, pixels through the family's reader; TRL's own fused loss on
  linear rows, packer's on caption trees) against every path run alone with the model's default attention.
"""

from __future__ import annotations

import importlib.util
import os

import datasets
import numpy as np
import pytest
import torch
from trl import SFTConfig, SFTTrainer

from packer.encode.tokenizers import load_tokenizer
from packer.errors import ConfigError, ShardError
from packer.train.trainers.trainer import PackedCollator
from packer.train.trainers.trl import PackedSFTTrainer
from tests.train.trainer_helpers import (
    StepRecorder,
    assert_grads_close,
    build_jsonl,
    chats,
    logged_losses,
    path_examples,
    tiny_llama,
    trees,
    trl_args,
)

pytestmark = [pytest.mark.slow]
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen2-vl")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    out = {"linear": build_jsonl(root, "linear", chats(24)), "trees": build_jsonl(root, "trees", trees(16), max_length=96)}
    cache = str(root / "hf-cache")
    return {k: (v, datasets.load_dataset(str(v), cache_dir=cache)["train"]) for k, v in out.items()}


def config(tmp_path, **kw) -> SFTConfig:
    return SFTConfig(**trl_args(tmp_path, **{"shuffle_dataset": False, "dataloader_num_workers": 0, **kw}))


def unpacked_reference(tmp_path, tok, examples: list[dict]) -> tuple[float, dict]:
    """TRL's own SFT step on unpacked examples: one row per example, padded, the whole batch in one step."""
    rec = StepRecorder()
    trainer = SFTTrainer(tiny_llama(), args=config(tmp_path, max_steps=1, per_device_train_batch_size=len(examples),
                                                   max_length=None),
                         train_dataset=datasets.Dataset.from_list(examples), processing_class=tok, callbacks=[rec])
    trainer.train()
    return logged_losses(trainer)[0], rec.grads[0]


def test_plain_trl_sft_trains_every_example_alone(builds, tok, tmp_path):
    """No packer argument: TRL's padding-free collator restarts positions at every example (seq_lengths) and the
    model's SDPA keeps each example to itself; losses and gradients equal TRL on the examples unpacked."""
    _, ds = builds["linear"]
    assert "images" not in ds.column_names and all(s is not None for s in ds["seq_lengths"])
    rows_per_step, steps = 2, 2
    rec = StepRecorder()
    trainer = SFTTrainer(tiny_llama(), args=config(tmp_path, padding_free=True, max_length=None, max_steps=steps,
                                                   per_device_train_batch_size=rows_per_step),
                         train_dataset=ds, processing_class=tok, callbacks=[rec])
    first = next(iter(trainer.get_train_dataloader()))
    examples = sum(len(ds[i]["example_ids"]) for i in range(rows_per_step))
    assert int((first["position_ids"][0] == 0).sum()) == examples > rows_per_step  # a reset per example, not per row
    trainer.train()
    losses = logged_losses(trainer)
    assert len(losses) == steps == len(rec.grads)
    for step in range(steps):
        rows = [ds[i] for i in range(step * rows_per_step, (step + 1) * rows_per_step)]
        want_loss, want_grads = unpacked_reference(tmp_path, tok, [e for r in rows for e in path_examples(r)])
        assert losses[step] == pytest.approx(want_loss, rel=1e-6)
        worst = assert_grads_close(rec.grads[step], want_grads)
        print(f"plain TRL step {step}: loss {losses[step]:.9f} vs unpacked {want_loss:.9f}, grad {worst:.1e}")


def test_rows_trl_cannot_train_alone_are_refused(builds, tok, tmp_path):
    out, ds = builds["trees"]
    assert "images" in ds.column_names and all(s is None for s in ds["seq_lengths"])
    args = config(tmp_path, padding_free=True, max_length=None, max_steps=1, per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="vision-related"):  # TRL's own refusal: the media columns stay
        SFTTrainer(tiny_llama(), args=args, train_dataset=ds, processing_class=tok)
    by_hand = ds.remove_columns(["images", "videos"])  # a user drops them: TRL's collator stops on the null
    trainer = SFTTrainer(tiny_llama(), args=args, train_dataset=by_hand, processing_class=tok)
    with pytest.raises(TypeError, match="NoneType"):
        trainer.train()
    # packer's collator inside a stock SFTTrainer: TRL's loss shifts labels, wrong at a branch start -> refused
    args = config(tmp_path, max_length=None, max_steps=1, per_device_train_batch_size=2, remove_unused_columns=False)
    trainer = SFTTrainer(tiny_llama().train(), args=args, train_dataset=by_hand, processing_class=tok,
                         data_collator=PackedCollator(out))
    from packer.train.attention.hf import use_packed_attention

    use_packed_attention(trainer.model)
    with pytest.raises(ConfigError, match="message trees reached the model with labels"):
        trainer.train()
    # TRL's default max_length truncates rows: the collator says what to set instead of training a cut row
    truncating = config(tmp_path, max_length=64, max_steps=1, per_device_train_batch_size=1,
                        remove_unused_columns=False)
    linear_out, linear = builds["linear"]
    trainer = SFTTrainer(tiny_llama(), args=truncating, train_dataset=linear, processing_class=tok,
                         data_collator=PackedCollator(linear_out))
    with pytest.raises(ShardError, match="max_length=None"):
        trainer.train()


def test_packed_sft_trainer_on_trees_with_accumulation(builds, tok, tmp_path):
    """Message trees through PackedSFTTrainer, one row per micro-batch, 2 micro-batches per step: the step's loss and
    gradients equal TRL's SFT step on every root-to-leaf path unpacked (the token mean over all of them)."""
    out, ds = builds["trees"]
    steps = 2
    # both runs read the same rows in the same order: one reference per step serves both
    want = [unpacked_reference(tmp_path, tok, [e for i in (2 * step, 2 * step + 1) for e in path_examples(ds[i])])
            for step in range(steps)]
    for train_dataset in (ds, out):  # load_dataset(OUT)["train"], or the path (PackedDataset: exact on W ranks)
        rec = StepRecorder()
        trainer = PackedSFTTrainer(tiny_llama(), args=config(tmp_path, max_steps=steps, per_device_train_batch_size=1,
                                                             gradient_accumulation_steps=2),
                                   train_dataset=train_dataset, processing_class=tok, callbacks=[rec])
        if train_dataset is out:
            trainer.train_dataset.shuffle = False  # the same sequential rows as the map-style run
        trainer.train()
        losses = logged_losses(trainer)
        for step in range(steps):
            want_loss, want_grads = want[step]
            assert losses[step] == pytest.approx(want_loss, rel=1e-6)
            worst = assert_grads_close(rec.grads[step], want_grads)
            print(f"PackedSFTTrainer trees step {step}: loss {losses[step]:.9f} vs {want_loss:.9f}, grad {worst:.1e}")


# ---------------------------------------------------------------------------------------- Qwen2-VL with images
def _equivalence():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "check_equivalence.py"
    spec = importlib.util.spec_from_file_location("check_equivalence", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _processor_class():
    from transformers import ProcessorMixin

    class ImageTextProcessor(ProcessorMixin):
        """Qwen2-VL's processor minus its video processor, which transformers cannot build without torchvision (not a
        packer dependency). TRL reads only ``.tokenizer`` from it here: packer's collator makes the pixels."""

        attributes = ["image_processor", "tokenizer"]
        image_processor_class = "AutoImageProcessor"
        tokenizer_class = "AutoTokenizer"

        def __init__(self, image_processor=None, tokenizer=None):
            super().__init__(image_processor, tokenizer)

    return ImageTextProcessor


@pytest.fixture(scope="module")
def vl_build(tmp_path_factory, coco_images):
    import shutil

    root = tmp_path_factory.mktemp("trl-vl")
    for i, im in enumerate(coco_images[:3]):
        shutil.copy(im, root / f"{i}.jpg")
    img = lambda i, t: [{"type": "image", "image": f"{i}.jpg"}, {"type": "text", "text": t}]  # noqa: E731
    linear = [{"messages": [{"role": "user", "content": img(i % 3, f"What is in picture {i}?")},
                            {"role": "assistant", "content": "A photo. " * (1 + i % 3)}]} for i in range(4)]
    linear.append({"messages": [{"role": "user", "content": "No image here."}, {"role": "assistant", "content": "Ok."}]})
    caption_trees = [{"messages": [{"role": "user", "content": img(i, "Caption it.")}],
                      "branches": [[{"role": "assistant", "content": "A street."}],
                                   [{"role": "assistant", "content": "Buses on a road " * (1 + i)}]]}
                     for i in range(2)]
    kw = dict(profile="qwen2-vl", max_length=1024, max_pixels=64 * 28 * 28)
    return {"linear": build_jsonl(root, "linear", linear, **kw), "trees": build_jsonl(root, "trees", caption_trees, **kw)}


@pytest.mark.parametrize("kind, loss", [("linear", "model"), ("trees", "packer")])
def test_packed_sft_trainer_on_qwen2_vl_images(vl_build, tok, tmp_path, kind, loss):
    """Qwen2-VL rows with images in one TRL step: mRoPE positions and pixels from packer's collator, attention from
    packer's backend; linear rows with TRL's own fused loss (shift_labels), caption trees with packer's. Equal to
    every path run alone (default SDPA, the model's own get_rope_index, the path's images)."""
    from packer.models import get_profile
    from packer.train.data.collate import collate
    from packer.train.data.dataset import PackedDataset

    ce = _equivalence()
    ImageTextProcessor = _processor_class()
    out = vl_build[kind]
    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    profile = get_profile("qwen2-vl", max_pixels=64 * 28 * 28)
    processor = ImageTextProcessor(image_processor=profile.reader().image_processor(), tokenizer=tok)
    token_ids = ce.profile_token_ids(profile, tok)
    model = ce.tiny_model(profile, token_ids=token_ids, vocab_size=ce.VOCAB)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rec = StepRecorder()
    trainer = PackedSFTTrainer(model, args=config(tmp_path, max_steps=1, per_device_train_batch_size=ds.num_rows),
                               train_dataset=ds, processing_class=processor, data_collator=PackedCollator(out),
                               callbacks=[rec], loss=loss, backend="sdpa_varlen" if kind == "linear" else "sdpa")
    trainer.train()
    (loss_value,) = logged_losses(trainer)

    reference = ce.tiny_model(profile, token_ids=token_ids, vocab_size=ce.VOCAB)
    reference.load_state_dict(state)
    batch = collate(list(PackedDataset(out, shuffle=False)))
    ref = ce.reference(reference, batch, profile, token_ids)
    count = batch["num_loss_tokens"]
    assert loss_value == pytest.approx(ref["total"] / count, rel=1e-5)
    worst = assert_grads_close(rec.grads[0], {n: g / count for n, g in ref["grads"].items()})
    print(f"PackedSFTTrainer qwen2-vl {kind}: loss {loss_value:.9f} vs {ref['total'] / count:.9f}, grad {worst:.1e}")
    assert np.isfinite(loss_value)
    assert any(b["images"] for b in ds)  # there were images in the step
    if kind == "trees":
        assert any(p >= 0 for r in ds["node_parents"] for p in r)
    assert torch.is_tensor(rec.grads[0]["model.visual.patch_embed.proj.weight"])  # the vision tower learned too
