"""One rank of a real multi-process run (tests/train/trainers/test_multiprocess.py launches it with ``torchrun`` or
``accelerate launch``), on CPU over gloo: ``--mode trainer``, transformers' Trainer (``PackedTrainer``, DDP),
``--mode trl``, TRL's SFTTrainer (``PackedSFTTrainer`` given the build's path), or
``--mode loop``, a plain PyTorch loop over ``PackedDataset`` with DDP or FSDP2 (``--wrap fsdp2``: accelerate has no
FSDP on CPU, so the Trainer cannot shard there; torch's ``fully_shard`` can).

Every rank records what each of its micro-batches held (example ids, fillers) at which optimizer step, and rank 0
records every step's gradients (after DDP's all-reduce, before the update) and the logged losses; rank 0 writes
them to ``--out``/record.json and grads.pt. The test recomputes every step from the unpacked examples.

    torchrun --nproc_per_node 2 tests/train/trainers/multirank_worker.py --data OUT --out DIR [--loss model] [--grad-accum 2]
    torchrun --nproc_per_node 2 tests/train/trainers/multirank_worker.py --mode loop --wrap fsdp2 --data OUT --out DIR

Several runs in one launch (two ranks' imports cost more than a tiny run): ``JOB --then JOB ...``, each JOB the
arguments above with its own ``--out``, run one after the other in the same ranks (``trainer``/``trl`` jobs before
``loop`` jobs, which reuse the process group the Trainer made).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root: tests.train.trainer_helpers

from transformers import TrainerCallback, TrainingArguments  # noqa: E402

from packer.train.attention.hf import FILLER_KWARG  # noqa: E402
from packer.train.data.dataset import PackedDataset  # noqa: E402
from packer.train.trainers.trainer import EXAMPLES_KWARG, PackedTrainer  # noqa: E402
from tests.train.trainer_helpers import tiny_llama  # noqa: E402

LR = 0.5


class RecordingMixin:
    """Notes each micro-batch's examples (and fillers) with the optimizer step it belongs to."""

    batches: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        filler = inputs.get(FILLER_KWARG)
        self.batches.append({"step": self.state.global_step, "examples": list(inputs[EXAMPLES_KWARG]),
                             "filler": [] if filler is None else filler.tolist(),
                             "num_items": None if num_items_in_batch is None else float(num_items_in_batch)})
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


class Recording(RecordingMixin, PackedTrainer):
    pass


class Grads(TrainerCallback):
    def __init__(self):
        self.grads: list[dict[str, torch.Tensor]] = []
        self.sharded = False  # were the gradients DTensors (FSDP2's fully_shard)?

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        out = {}
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            g = p.grad.detach()
            if hasattr(g, "full_tensor"):  # FSDP2: a sharded DTensor
                g = g.full_tensor()
                self.sharded = True
            out[name.removeprefix("module.").replace("_fsdp_wrapped_module.", "")] = g.clone()
        self.grads.append({"step": state.global_step, "grads": out})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    jobs, job = [], []
    for a in [*argv, "--then"]:
        if a == "--then":
            jobs.append(job)
            job = []
        else:
            job.append(a)
    kept = [run(job) for job in jobs]  # every run's trainer and model live until the exit (see leave)
    leave(kept)


def run(argv: list[str]) -> object:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--loss", default="packer", choices=("packer", "model"))
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1, help="packed rows per micro-batch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--save-steps", type=int, default=0)
    ap.add_argument("--resume", help="a checkpoint directory to resume from")
    ap.add_argument("--mode", default="trainer", choices=("trainer", "trl", "loop"))
    ap.add_argument("--weighting", default="token", help="packer.train.trainers.loss WEIGHTINGS (trainer and trl modes)")
    ap.add_argument("--prefix", default="once", help="packer.train.trainers.loss PREFIXES (trainer and trl modes)")
    ap.add_argument("--wrap", default="ddp", choices=("ddp", "fsdp2"), help="--mode loop only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "loop":
        return loop(args, out)

    common = dict(
        output_dir=str(out / "checkpoints"), per_device_train_batch_size=args.rows,
        gradient_accumulation_steps=args.grad_accum, num_train_epochs=args.epochs, learning_rate=LR, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1, report_to=[], use_cpu=True, seed=0,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        disable_tqdm=True, dataloader_num_workers=0, ddp_backend="gloo")
    training = TrainingArguments(**common)
    grads = Grads()
    if args.mode == "trl":  # TRL's SFTTrainer around packer's rows: the build path, read per rank
        from trl import SFTConfig

        from packer.encode.tokenizers import load_tokenizer
        from packer.train.trainers.trl import PackedSFTTrainer

        class RecordingSFT(RecordingMixin, PackedSFTTrainer):
            pass

        config = SFTConfig(**common, bf16=False)  # TRL defaults to bf16
        trainer = RecordingSFT(tiny_llama(seed=0), args=config, train_dataset=args.data, loss=args.loss,
                               processing_class=load_tokenizer("qwen2-vl"), callbacks=[grads],
                               weighting=args.weighting, prefix=args.prefix)
    else:
        trainer = Recording(model=tiny_llama(seed=0), args=training, train_dataset=PackedDataset(args.data, seed=0),
                            loss=args.loss, callbacks=[grads], weighting=args.weighting, prefix=args.prefix)
    trainer.batches = []
    trainer.train(resume_from_checkpoint=args.resume)

    import torch.distributed as dist

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = {"rank": rank, "batches": trainer.batches, "global_step": trainer.state.global_step}
    every = [None] * world
    if world > 1:
        dist.all_gather_object(every, mine)
    else:
        every = [mine]
    if rank == 0:
        losses = [{"step": h["step"], "loss": h["loss"],
                   "sources": {k: v for k, v in h.items() if k.split("/")[0] in ("loss", "tokens", "loss_tokens",
                                                                                  "examples") and "/" in k}}
                  for h in trainer.state.log_history if "loss" in h]
        (out / "record.json").write_text(json.dumps({
            "world": world, "ranks": every, "losses": losses, "env_world": os.environ.get("WORLD_SIZE"),
            "wrapped": type(trainer.model_wrapped).__name__, "fsdp": trainer.is_fsdp_enabled,
            "sharded_grads": grads.sharded}))
        torch.save(grads.grads, out / "grads.pt")
    return trainer


def leave(kept: list) -> None:
    """Leave together, skipping the interpreter's teardown: gloo's threads alive at exit aborted a rank once
    ("terminate called without an active exception"), destroy_process_group once hung one, and torch 2.13's
    ~ProcessGroupGloo (run when the DDP reducer drops the group) joins gloo's loop thread while holding the GIL,
    and that thread may still need the GIL to free the barrier's work: a rank hung there at exit about one run in
    two (py-spy: Reducer dealloc -> ~ProcessGroupGloo -> thread::join; runLoop -> ~AsyncBarrierWork ->
    decref_pyobject). Everything is written; leave at once, every run's model still held (``kept``)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def loop(args: argparse.Namespace, out: Path) -> object:
    """The same training as a plain loop: each rank reads ``PackedDataset(rank, world_size)``, accumulates
    ``--grad-accum`` micro-batches, divides packer's summed loss by the step's global loss-token count (all-reduced
    before any forward) times the world size (DDP and FSDP2 average gradients over ranks), one SGD step."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from packer.train.attention.hf import LAYOUT_KWARG, use_packed_attention
    from packer.train.trainers.loss import packed_cross_entropy
    from packer.train.trainers.trainer import PackedCollator

    if not dist.is_initialized():  # a loop after a trainer run in the same launch: the Trainer's group
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_llama(seed=0)
    use_packed_attention(model, "sdpa_varlen")
    if args.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
    data = PackedDataset(args.data, rank=rank, world_size=world, seed=0)
    loader = DataLoader(data, batch_size=args.rows, collate_fn=PackedCollator())
    batches, losses, grads = [], [], Grads()
    step = 0
    for epoch in range(args.epochs):
        data.set_epoch(epoch)
        it = iter(loader)
        while True:
            micro = [b for b in (next(it, None) for _ in range(args.grad_accum)) if b is not None]
            count = torch.tensor([float(len(micro)), float(sum(int((b["labels"] != -100).sum()) for b in micro))])
            dist.all_reduce(count)
            if count[0] == 0:
                break  # every rank ran out together: equal steps
            total = torch.zeros(())
            for b in micro:
                filler = b.pop(FILLER_KWARG, None)
                batches.append({"step": step, "examples": list(b.pop(EXAMPLES_KWARG)),
                                "filler": [] if filler is None else filler.tolist(), "num_items": float(count[1])})
                labels = b.pop("labels")
                b.pop("shift_labels", None)
                logits = wrapped(**b).logits
                loss = packed_cross_entropy(logits, labels, b[LAYOUT_KWARG]).loss
                (loss * world / count[1]).backward()
                total += loss.detach()
            dist.all_reduce(total)
            losses.append({"step": step + 1, "loss": float(total / count[1])})
            grads.on_pre_optimizer_step(None, type("S", (), {"global_step": step})(), None, model=wrapped)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
    mine = {"rank": rank, "batches": batches, "global_step": step}
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        (out / "record.json").write_text(json.dumps({
            "world": world, "ranks": every, "losses": losses, "wrapped": type(wrapped).__name__,
            "fsdp": args.wrap == "fsdp2", "sharded_grads": grads.sharded}))
        torch.save(grads.grads, out / "grads.pt")
    dist.barrier()  # rank 0 has written before any rank starts the next run
    return wrapped


if __name__ == "__main__":
    main()
