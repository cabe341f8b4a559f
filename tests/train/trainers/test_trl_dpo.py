"""DPO on packer's preference trees inside TRL equals TRL's own DPO on the same pairs unpacked (fp32, real models).

Text: ``PackedDPOTrainer`` (one policy and one reference forward per packed row, ``sequence_logps`` per branch,
TRL's sigmoid loss averaged over the step's pairs) against TRL 1.16's ``DPOTrainer`` on the raw
``{"prompt", "chosen", "rejected"}`` records, which it tokenizes itself: the same loss and every gradient. The
build uses the Llama-3 template, where TRL's completion (prompt+answer minus the prompt with its generation
prompt) is exactly packer's loss span (the answer and its ``<|eot_id|>``); ChatML templates end a turn with a
newline that TRL scores and packer does not. The rows hold unequal numbers of pairs and go through gradient
accumulation, so the step-wide pair mean is what makes the two equal.

Images in the prompt: Qwen2-VL preference trees with a COCO image in the prompt through ``PackedDPOTrainer``
against every (prompt + answer) path run alone with the model's default attention, its own ``get_rope_index``
and the path's image, for the policy and the reference.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from trl import DPOConfig, DPOTrainer

from packer.core.types import IGNORE_INDEX
from packer.encode.tokenizers import load_tokenizer
from packer.train.trainers.trl import PackedDPOTrainer
from tests.train.trainer_helpers import (
    A,
    StepRecorder,
    U,
    assert_grads_close,
    build_jsonl,
    logged_losses,
    tiny_llama,
    trl_args,
)

pytestmark = [pytest.mark.slow]
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
LLAMA3_VOCAB = 128256
BETA = 0.1

PAIRS = [
    {"prompt": [U("What colour is the sky?")], "chosen": [A("Blue.")], "rejected": [A("Green, always, everywhere.")]},
    {"prompt": [{"role": "system", "content": "Be kind."}, U("Hi"), A("Hello!"), U("Tell me a joke.")],
     "chosen": [A("Why did the chicken cross the road? " * 2)], "rejected": [A("No.")]},
    {"chosen": [U("Count to three."), A("1 2 3")], "rejected": [U("Count to three."), A("one, two, many")]},
    {"prompt": [U("Summarise: " + "the cat sat on the mat. " * 6)], "chosen": [A("A cat sat.")],
     "rejected": [A("Dogs bark loudly at night.")]},
    {"prompt": [U("2 + 2?")], "chosen": [A("4")], "rejected": [A("5, I think.")]},
    {"prompt": [U("Name a colour.")], "chosen": [A("Red.")], "rejected": [A("Loud.")]},
]


def dpo_config(tmp_path, **kw) -> DPOConfig:
    return DPOConfig(**trl_args(tmp_path, **{"beta": BETA, "max_steps": 1, "max_length": None, **kw}))


def packed_dpo(tmp_path, rows: datasets.Dataset, tok, rec: StepRecorder) -> PackedDPOTrainer:
    """PackedDPOTrainer over ``rows``, one packed row per micro-batch, the step's pairs over all of them."""
    return PackedDPOTrainer(tiny_llama(LLAMA3_VOCAB, seed=0), ref_model=tiny_llama(LLAMA3_VOCAB, seed=1),
                            args=dpo_config(tmp_path, per_device_train_batch_size=1,
                                            gradient_accumulation_steps=rows.num_rows),
                            train_dataset=rows, processing_class=tok, callbacks=[rec])


def test_packed_dpo_equals_trl_dpo_on_the_unpacked_pairs(tmp_path):
    tok = load_tokenizer("llama3")
    out = build_jsonl(tmp_path, "pairs", PAIRS, tokenizer="llama3", max_length=150)
    rows = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert rows.num_rows >= 2 and len({len(r) for r in rows["example_ids"]}) > 1  # unequal pairs per row

    # TRL's own DPO: the raw records, tokenized by TRL, every pair in one batch
    rec = StepRecorder()
    trl = DPOTrainer(tiny_llama(LLAMA3_VOCAB, seed=0), ref_model=tiny_llama(LLAMA3_VOCAB, seed=1),
                     args=dpo_config(tmp_path, per_device_train_batch_size=len(PAIRS)),
                     train_dataset=_trl_dataset(),
                     processing_class=tok, callbacks=[rec])
    _check_same_tokens(trl.train_dataset, rows)
    trl.train()

    # packer's trees: one packed row per micro-batch, the step's pairs over all of them
    packed_rec = StepRecorder()
    packed = packed_dpo(tmp_path, rows, tok, packed_rec)
    packed.train()
    assert logged_losses(packed)[0] == pytest.approx(logged_losses(trl)[0], rel=1e-6)
    worst = assert_grads_close(packed_rec.grads[0], rec.grads[0])
    print(f"packed DPO vs TRL DPO: loss {logged_losses(packed)[0]:.9f} vs {logged_losses(trl)[0]:.9f}, "
          f"grad max diff / max grad {worst:.1e}")


def _trl_dataset() -> datasets.Dataset:
    """The records as TRL takes them; an implicit prompt is split off by TRL's own ``extract_prompt`` (TRL calls it
    only when the first record lacks a prompt)."""
    from trl.data_utils import extract_prompt

    return datasets.Dataset.from_list([p if "prompt" in p else extract_prompt(p) for p in PAIRS])


def _check_same_tokens(tokenized: datasets.Dataset, rows: datasets.Dataset) -> None:
    """TRL's prompt+chosen / prompt+rejected ids and completion spans are packer's paths and loss tokens."""
    from tests.train.trainer_helpers import path_examples

    paths = [e for r in rows for e in path_examples(r)]
    want = {}
    for e in paths:
        k = next(i for i, lab in enumerate(e["labels"]) if lab != IGNORE_INDEX)
        want[tuple(e["input_ids"])] = k
    for t in tokenized:
        for side in ("chosen_ids", "rejected_ids"):
            ids = tuple(t["prompt_ids"] + t[side])
            assert ids in want, "TRL tokenized a pair differently from packer"
            assert want[ids] == len(t["prompt_ids"]), "TRL's completion starts elsewhere than packer's loss"


# ---------------------------------------------------------------------------------------- images in the prompt
def _equivalence():
    path = Path(__file__).resolve().parents[3] / "scripts" / "check_equivalence.py"
    spec = importlib.util.spec_from_file_location("check_equivalence", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packed_dpo_with_an_image_in_the_prompt(tmp_path, coco_images):
    import shutil

    from transformers import ProcessorMixin

    from packer.models import get_profile
    from packer.train.attention.layout import PackedLayout
    from packer.train.data.collate import collate
    from packer.train.data.dataset import PackedDataset
    from packer.train.trainers.trainer import PackedCollator

    ce = _equivalence()
    for i, im in enumerate(coco_images[:2]):
        shutil.copy(im, tmp_path / f"{i}.jpg")
    img = lambda i, t: [{"type": "image", "image": f"{i}.jpg"}, {"type": "text", "text": t}]  # noqa: E731
    records = [{"prompt": [{"role": "user", "content": img(i % 2, f"What is in picture {i}?")}],
                "chosen": [A("A street with buses." * (1 + i % 2))], "rejected": [A("A cat.")]} for i in range(3)]
    records.append({"prompt": [U("Text only?")], "chosen": [A("Yes.")], "rejected": [A("No, never.")]})
    out = build_jsonl(tmp_path, "vl-pairs", records, profile="qwen2-vl", max_length=2048, max_pixels=64 * 28 * 28)
    rows = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]

    tok = load_tokenizer("qwen2-vl")
    profile = get_profile("qwen2-vl", max_pixels=64 * 28 * 28)

    class ImageTextProcessor(ProcessorMixin):  # Qwen2-VL's processor minus torchvision's video processor
        attributes = ["image_processor", "tokenizer"]
        image_processor_class = "AutoImageProcessor"
        tokenizer_class = "AutoTokenizer"

        def __init__(self, image_processor=None, tokenizer=None):
            super().__init__(image_processor, tokenizer)

    token_ids = ce.profile_token_ids(profile, tok)
    policy = ce.tiny_model(profile, token_ids=token_ids, vocab_size=ce.VOCAB, seed=0)
    reference = ce.tiny_model(profile, token_ids=token_ids, vocab_size=ce.VOCAB, seed=1)
    states = [{k: v.clone() for k, v in m.state_dict().items()} for m in (policy, reference)]
    rec = StepRecorder()
    trainer = PackedDPOTrainer(policy, ref_model=reference, args=dpo_config(tmp_path, per_device_train_batch_size=1,
                                                                            gradient_accumulation_steps=rows.num_rows),
                               train_dataset=rows, processing_class=ImageTextProcessor(
                                   image_processor=profile.reader().image_processor(), tokenizer=tok),
                               data_collator=PackedCollator(out), callbacks=[rec], backend="sdpa")
    trainer.train()

    # every pair's two paths alone (default attention, own positions and image), policy and reference
    ref_policy, ref_reference = (ce.tiny_model(profile, token_ids=token_ids, vocab_size=ce.VOCAB) for _ in range(2))
    ref_policy.load_state_dict(states[0])
    ref_reference.load_state_dict(states[1])
    batch = collate(list(PackedDataset(out, shuffle=False)))
    layout = PackedLayout.from_batch(batch)
    path_kwargs = profile.proof().path_inputs(batch, token_ids)
    ranges = ce._node_ranges(layout)
    labels = batch["labels"][0]

    def logp(model, nodes):
        tokens = torch.cat([torch.arange(*ranges[n]) for n in nodes])
        logits = model(**path_kwargs(tokens)).logits[0]
        k = (labels[tokens] != IGNORE_INDEX).nonzero().reshape(-1)
        return -F.cross_entropy(logits[k - 1].float(), labels[tokens][k], reduction="sum")

    paths = ce.leaf_paths(layout)
    losses = []
    for chosen, rejected in zip(paths[0::2], paths[1::2], strict=True):
        with torch.no_grad():
            rc, rr = logp(ref_reference, chosen), logp(ref_reference, rejected)
        pc, pr = logp(ref_policy, chosen), logp(ref_policy, rejected)
        losses.append(-F.logsigmoid(BETA * ((pc - rc) - (pr - rr))))
    loss = torch.stack(losses).mean()
    loss.backward()
    assert len(losses) == len(records)
    assert logged_losses(trainer)[0] == pytest.approx(float(loss.detach()), rel=1e-5)
    worst = assert_grads_close(rec.grads[0], {n: p.grad for n, p in ref_policy.named_parameters() if p.grad is not None})
    print(f"packed DPO with images vs paths alone: loss {logged_losses(trainer)[0]:.9f} vs {float(loss.detach()):.9f}, "
          f"grad max diff / max grad {worst:.1e}")


# ---------------------------------------------------------------------------------------- weighted answers
WEIGHTED = [
    {"prompt": [U("What colour is the sky?")], "chosen": [{**A("Blue."), "loss": 2.0}],
     "rejected": [{**A("Green, always, everywhere."), "loss": 0.5}]},
    {"prompt": [U("Hi"), A("Hello!"), U("Tell me a joke.")], "chosen": [A("Why did the chicken cross the road?")],
     "rejected": [{**A("No."), "loss": 3.0}]},
    {"prompt": [U("2 + 2?")], "chosen": [{**A("4"), "loss": 0.25}], "rejected": [A("5, I think.")]},
]


def test_packed_dpo_with_loss_weights_equals_the_definition(tmp_path):
    """Answers with a ``"loss"`` weight (schema v4's ``loss_weights``) through ``PackedDPOTrainer``: each answer's
    log-probability is the weighted sum of its tokens' (TRL's DPO has no per-token weights, so the reference is
    that definition on each path alone with the same policy and reference models): TRL's sigmoid loss over the
    step's pairs, its value and every gradient."""
    from packer.train.data.dataset import PackedDataset
    from tests.train.trainer_helpers import weighted_paths

    tok = load_tokenizer("llama3")
    out = build_jsonl(tmp_path, "weighted", WEIGHTED, tokenizer="llama3", max_length=120)
    rows = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert any(r["loss_weights"] is not None for r in rows)
    rec = StepRecorder()
    packed = packed_dpo(tmp_path, rows, tok, rec)
    packed.train()

    policy, reference = tiny_llama(LLAMA3_VOCAB, seed=0), tiny_llama(LLAMA3_VOCAB, seed=1)

    def logp(model, path) -> torch.Tensor:
        ids = torch.as_tensor(path["ids"], dtype=torch.long)[None]
        labels = torch.as_tensor(path["labels"], dtype=torch.long)
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        on = labels[1:] != IGNORE_INDEX
        token = lp[torch.arange(len(on)), labels[1:].clamp(min=0)]
        return (token * torch.as_tensor(path["weights"][1:]) * on).sum()

    paths = [p for r in PackedDataset(out, shuffle=False) for p in weighted_paths(r)]
    by_example: dict[str, list] = {}
    for p in paths:
        by_example.setdefault(p["example"], []).append(p)
    assert len(by_example) == len(WEIGHTED) and all(len(v) == 2 for v in by_example.values())
    losses = []
    for chosen, rejected in by_example.values():  # packer's preference trees: the chosen branch first
        with torch.no_grad():
            rc, rr = logp(reference, chosen), logp(reference, rejected)
        losses.append(-F.logsigmoid(BETA * ((logp(policy, chosen) - rc) - (logp(policy, rejected) - rr))))
    loss = torch.stack(losses).mean()
    loss.backward()
    want = {n: p.grad.detach().clone() for n, p in policy.named_parameters()}
    assert logged_losses(packed)[0] == pytest.approx(float(loss.detach()), rel=1e-6)
    worst = assert_grads_close(rec.grads[0], want)
    weights = {float(w) for p in paths for w in p["weights"][np.asarray(p["labels"]) != IGNORE_INDEX]}
    assert {2.0, 0.5, 3.0, 0.25, 1.0} <= weights
    print(f"weighted packed DPO vs definition: loss {logged_losses(packed)[0]:.9f} vs {float(loss.detach()):.9f}, "
          f"grad max diff / max grad {worst:.1e}")
