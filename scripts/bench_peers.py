#!/usr/bin/env python
"""packer against TRL's own preprocessing on the same records, each in a fresh process, interleaved.

    python scripts/bench_peers.py --records 50000 --num-proc 2 --max-length 2048 --repeats 3

The records: linear chats (1-4 turns, lognormal answers) written from COCO's captions (real English sentences, so
BPE sees real words; ``shared/data/coco-mini``), the same JSONL file for both sides. Both use the builtin qwen2-vl
tokenizer (Qwen2's vocabulary and ChatML template) and ``--num-proc`` processes:

- packer: ``packer build CORPUS -o OUT --profile text --max-length L --overlong truncate --num-proc N`` (the CLI:
  parse, render, tokenize, one global plan, Parquet shards, stats, card, manifest; ``truncate`` keeps an over-long
  chat's head, as TRL's ``bfd`` does, so both sides keep every record);
- TRL 1.16: ``datasets.load_dataset("json", ...)`` and ``SFTTrainer(model, train_dataset=..., args=SFTConfig(
  packing=True, packing_strategy="bfd", max_length=L, dataset_num_proc=N))`` on a tiny model (its construction
  is what tokenizes and packs the data: ``_prepare_dataset``), with a fresh ``datasets`` cache per run.

The other peers (``--peers packer,trl,llamafactory,llamafactory-neat,ms-swift,axolotl``), once each, every one in
its own venv under ``--venvs`` that the script creates (``pip install <peer>``: they pin other transformers /
datasets / torch than packer, so none installs beside packer's pins), driven by a child of this script under
that venv's python with the same chats and packer's builtin qwen2-vl files saved as a full Qwen2-VL processor dir
(``save_processor``: tokenizer, chat template, image / video processor and processor configs), plus a 1-layer
width-8 Qwen2 for the CLIs that load a model; no hub here:

- LLaMA-Factory: ``get_dataset(stage="sft")`` with ``packing`` (greedy knapsack per ``datasets.map`` batch, every
  pack padded to ``cutoff_len + 1``; examples see each other) and with ``neat_packing`` (attention mask numbered per
  example: isolated);
- ms-swift: ``swift sft --packing true --max_steps 1``; axolotl: ``axolotl preprocess`` with ``sample_packing``.

A peer that cannot install or run here is a row with its error. ``--images N`` adds an image set (N COCO
image + caption chats) for ``--image-sides`` (packer ``--profile qwen2-vl``; TRL with the Qwen2-VL processor;
LLaMA-Factory's ``qwen2_vl`` template; ms-swift's; axolotl's ``processor_type: AutoProcessor`` with
``sample_packing`` kept on).

Printed per side, median of ``--repeats`` runs: wall, CPU (the whole process tree: ``RUSAGE_CHILDREN`` after the
child exits, which counts every waited-for descendant), peak RSS (the sum of the tree's VmRSS, sampled every
50 ms), packs and packs over the lower bound (ceil(tokens / L) of that side's own tokens), and which tokens carry
loss (packer: assistant turns and their end token; TRL by default: every token). The machine is shared: the
load average before and after each run is printed with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def make_chats(path: Path, coco: Path, records: int, seed: int = 0) -> None:
    """Linear text chats from COCO caption sentences: 1-4 turns, answers of lognormal length."""
    rng = np.random.default_rng(seed)
    caps = json.loads((coco / "annotations" / "captions_train2017.json").read_text())["annotations"]
    sentences = [c["caption"].strip().rstrip(".") + "." for c in caps]

    def text(n: int) -> str:
        return " ".join(sentences[i] for i in rng.integers(0, len(sentences), size=max(1, n)))

    with open(path, "w") as f:
        for _ in range(records):
            size = rng.lognormal(np.log(4), 0.9)
            msgs = []
            for _t in range(int(rng.integers(1, 5))):
                msgs += [{"role": "user", "content": text(int(rng.integers(1, 3)))},
                         {"role": "assistant", "content": text(int(size))}]
            f.write(json.dumps({"messages": msgs}) + "\n")


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (OSError, StopIteration):
            continue
    return total


def measure(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd`` to completion: wall, CPU of the whole tree, peak tree RSS, its last stdout line as JSON."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:  # never a full pipe
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=fout, stderr=ferr, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except json.JSONDecodeError:  # a peer's CLI ran to the end but printed no figures of its own
        result = {}
    return {"wall": wall, "cpu": cpu, "rss_mib": peak / 2**20, "load": (load, os.getloadavg()[0]), **result}


def packer_side(corpus: Path, out: Path, max_length: int, num_proc: int, env: dict) -> dict:
    cmd = [str(Path(sys.executable).parent / "packer"), "build", str(corpus), "-o", str(out), "--profile", "text",
           "--tokenizer", "qwen2-vl", "--max-length", str(max_length), "--overlong", "truncate",
           "--num-proc", str(num_proc), "--overwrite",
           "--quiet"]
    r = measure(cmd, env)
    t = json.loads((out / "manifest.json").read_text())["totals"]
    return {**r, "packs": t["packs"], "tokens": t["tokens"], "loss_tokens": t["loss_tokens"], "examples": t["examples"]}


def qwen2vl_processor(tokdir: str):
    """The processor of ``save_processor``'s directory: ``AutoProcessor.from_pretrained``; where torchvision is
    missing (packer's venv), transformers' Qwen2-VL video processor cannot load, so the same ``Qwen2VLProcessor``
    from the directory's tokenizer (the fast class: AutoTokenizer parses its 18 MB JSON once more in Python), image
    processor and chat template with no video processor (images only)."""
    import importlib.util

    from transformers import AutoImageProcessor, AutoProcessor, PreTrainedTokenizerFast, Qwen2VLProcessor

    if importlib.util.find_spec("torchvision") is not None:
        return AutoProcessor.from_pretrained(tokdir)

    class ImagesOnly(Qwen2VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImagesOnly(image_processor=AutoImageProcessor.from_pretrained(tokdir),
                      tokenizer=PreTrainedTokenizerFast.from_pretrained(tokdir), video_processor=None,
                      chat_template=(Path(tokdir) / "chat_template.jinja").read_text())


def trl_child(corpus: str, out: str, max_length: int, num_proc: int, tokdir: str) -> None:
    """TRL's preprocessing in this process; prints its packs and token counts as JSON. On the image set
    (``images`` column) the processing class is the Qwen2-VL processor of ``tokdir``, as TRL's VLM docs do."""
    import torch
    from datasets import load_dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from packer.encode.tokenizers import load_tokenizer

    images = "image" in Path(corpus).name
    processing = qwen2vl_processor(tokdir) if images else load_tokenizer("qwen2-vl")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=151936, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True))
    data = load_dataset("json", data_files=corpus, split="train")
    args = SFTConfig(output_dir=out, packing=True, packing_strategy="bfd", max_length=max_length,
                     dataset_num_proc=num_proc, bf16=False, use_cpu=True, report_to=[], disable_tqdm=True)
    trainer = SFTTrainer(model, args=args, train_dataset=data, processing_class=processing)
    packed = trainer.train_dataset
    lengths = [sum(s) for s in packed["seq_lengths"]]
    loss = sum(sum(1 for x in labels if x != -100) for labels in packed["labels"])
    examples = sum(len(s) for s in packed["seq_lengths"])
    print(json.dumps({"packs": packed.num_rows, "tokens": int(sum(lengths)), "loss_tokens": int(loss),
                      "examples": int(examples)}))


def trl_side(corpus: Path, out: Path, max_length: int, num_proc: int, env: dict, tokdir: Path | None = None) -> dict:
    cache = tempfile.mkdtemp(prefix="bench-peers-hf-")  # TRL's and datasets' map caches: cold every run
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-child", str(corpus), str(out), str(max_length),
           str(num_proc), str(tokdir or "")]
    try:
        return measure(cmd, {**env, "HF_DATASETS_CACHE": cache})
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


# ---- the other peers: each in its own venv (they do not install beside packer's pins), driven by a child of
# this script under that venv's python; the child imports only the peer, never packer.

PEERS = {  # name -> (pip requirement, what it runs)
    "llamafactory": ("llamafactory==0.9.5", "get_dataset(stage='sft') with packing (greedy knapsack per map batch)"),
    "llamafactory-neat": ("llamafactory==0.9.5", "get_dataset(stage='sft') with neat_packing (isolated examples)"),
    "ms-swift": ("ms-swift==4.6.0", "`swift sft --packing true` (its PackingDataset: binpacking per 1,000 records)"),
    "axolotl": ("axolotl", "`axolotl preprocess` with sample_packing"),
}
VENV_OF = {"llamafactory-neat": "llamafactory"}


def peer_venv(root: Path, name: str, log: Path) -> tuple[Path | None, str]:
    """The peer's venv under ``root``, created and installed on first use (pip resolves its own torch: PyPI's,
    whose torchvision/torchaudio load with it; it runs on CPU here)."""
    venv = root / VENV_OF.get(name, name)
    py = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        return py, marker.read_text()
    spec = PEERS[name][0]
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with open(log, "a") as f:
        proc = subprocess.run([str(py), "-m", "pip", "install", spec], stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode:
        tail = log.read_text().strip().splitlines()[-3:]
        return None, f"pip install {spec} failed: {' | '.join(tail)[-600:]}"
    version = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    pins = [ln for ln in version.splitlines() if ln.split("==")[0].lower().replace("_", "-") in
            {"llamafactory", "ms-swift", "axolotl", "transformers", "datasets", "torch", "trl"}]
    marker.write_text(", ".join(pins))
    return py, marker.read_text()


def _pack_stats(rows: list[dict], pad_id: int | None) -> dict:
    """packs, real tokens, examples from packed rows (padding: the trailing pad ids / zero attention mask)."""
    tokens = examples = 0
    for r in rows:
        mask = r.get("attention_mask")
        if mask is not None and max(mask) > 1:  # neat packing: 1..n per example, 0 on padding
            tokens += sum(1 for m in mask if m)
            examples += max(mask)
            continue
        pos = r.get("position_ids")
        ids = r["input_ids"]
        n = len(ids)
        if pad_id is not None:
            while n and ids[n - 1] == pad_id:
                n -= 1
        tokens += n
        if pos is not None:
            examples += sum(1 for p in pos[:n] if p == 0)
        elif "seq_lengths" in r:
            examples += len(r["seq_lengths"])
    return {"packs": len(rows), "tokens": tokens, "examples": examples}


def llamafactory_child(corpus: str, out: str, max_length: int, num_proc: int, tokdir: str, neat: bool) -> None:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    ddir = Path(out) / "data"
    ddir.mkdir(parents=True, exist_ok=True)
    info = {"chats": {"file_name": str(Path(corpus).resolve()), "formatting": "sharegpt",
                      "columns": {"messages": "messages", **({"images": "images"} if "image" in corpus else {})},
                      "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                               "assistant_tag": "assistant"}}}
    (ddir / "dataset_info.json").write_text(json.dumps(info))
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(dict(
        model_name_or_path=tokdir, stage="sft", do_train=True, finetuning_type="full", dataset="chats",
        dataset_dir=str(ddir), template="qwen2_vl" if "image" in corpus else "qwen", cutoff_len=max_length,
        packing=True, neat_packing=neat, preprocessing_num_workers=num_proc, overwrite_cache=True,
        output_dir=str(Path(out) / "run"), report_to="none", use_cpu=True))
    tm = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tm["tokenizer"], data_args)
    ds = get_dataset(template, model_args, data_args, training_args, stage="sft", **tm)["train_dataset"]
    stats = _pack_stats(ds.to_list(), tm["tokenizer"].pad_token_id)
    loss = sum(sum(1 for x in labels if x != -100) for labels in ds["labels"])
    print(json.dumps({**stats, "loss_tokens": loss, "capacity": max_length + 1, "isolated": neat}))


def swift_child(corpus: str, out: str, max_length: int, num_proc: int, tokdir: str) -> None:
    """``swift sft --packing true`` on the tiny model (its dataset preparation runs before the first step)."""
    cli = Path(sys.executable).parent / "swift"
    template = "qwen2_vl" if "image" in corpus else "qwen"
    os.execv(str(cli), [str(cli), "sft", "--model", tokdir, "--model_type", "qwen2", "--template", template,
                        "--dataset", corpus, "--packing", "true", "--max_length", str(max_length),
                        "--dataset_num_proc", str(num_proc), "--max_steps", "1", "--output_dir", out,
                        "--report_to", "none", "--tuner_type", "full", "--split_dataset_ratio", "0",
                        "--save_strategy", "no"])


def axolotl_child(corpus: str, out: str, max_length: int, num_proc: int, tokdir: str) -> None:
    """``axolotl preprocess`` with sample_packing: it tokenizes and saves the dataset; its packs are made at train
    time (MultipackBatchSampler), so the child reports the prepared examples and tokens, not packs."""
    import yaml
    from datasets import load_from_disk

    Path(out).mkdir(parents=True, exist_ok=True)
    prepared = Path(out) / "prepared"
    cfg = {"base_model": tokdir, "datasets": [{"path": corpus, "ds_type": "json", "type": "chat_template",
                                               "field_messages": "messages"}],
           "sequence_len": max_length, "sample_packing": True, "dataset_prepared_path": str(prepared),
           "dataset_processes": num_proc, "output_dir": str(Path(out) / "run"), "micro_batch_size": 1,
           "num_epochs": 1, "learning_rate": 1e-5, "chat_template": "chatml"}
    if "image" in Path(corpus).name:  # its multimodal settings (docs/multimodal.qmd), sample_packing kept on
        import shutil

        from transformers import Qwen2VLConfig

        # axolotl takes a model for multimodal (and loads its processor) only by the config's model_type
        model = Path(out) / "qwen2-vl"
        shutil.copytree(tokdir, model, dirs_exist_ok=True)
        Qwen2VLConfig(text_config={"vocab_size": 151936, "hidden_size": 8, "intermediate_size": 16,
                                   "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1},
                      vision_config={"depth": 1, "embed_dim": 8, "hidden_size": 8, "num_heads": 1}
                      ).save_pretrained(model)
        cfg.update(base_model=str(model), processor_type="AutoProcessor", chat_template="qwen2_vl",
                   remove_unused_columns=False)
    (Path(out) / "cfg.yml").write_text(yaml.safe_dump(cfg))
    cli = Path(sys.executable).parent / "axolotl"
    proc = subprocess.run([str(cli), "preprocess", str(Path(out) / "cfg.yml")], stdout=sys.stderr,
                          stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode:  # the row gets its exception, not this script's traceback
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        at = max((i for i, ln in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception):", ln)), default=len(lines) - 1)
        raise SystemExit(f"axolotl preprocess failed: {' '.join(lines[at:at + 2])[:400]}")
    saved = sorted(p.parent for p in prepared.rglob("dataset_info.json"))
    ds = load_from_disk(str(saved[0]))
    tokens = sum(len(x) for x in ds["input_ids"])
    print(json.dumps({"packs": None, "tokens": tokens, "examples": ds.num_rows, "isolated": None,
                      "note": "packs made at train time by MultipackBatchSampler"}))


def peer_side(name: str, corpus: Path, out: Path, max_length: int, num_proc: int, env: dict, root: Path,
              tokdir: Path) -> dict:
    py, info = peer_venv(root, name, root / f"{name}.log")
    if py is None:
        return {"error": info}
    cache = tempfile.mkdtemp(prefix="bench-peers-hf-")
    cmd = [str(py), str(Path(__file__).resolve()), "--peer-child", name, str(corpus), str(out), str(max_length),
           str(num_proc), str(tokdir)]
    child_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    child_env["AXOLOTL_DO_NOT_TRACK"] = "1"  # axolotl's telemetry would retry an unreachable host at exit
    try:
        return {**measure(cmd, {**child_env, "HF_DATASETS_CACHE": cache, "HF_HOME": cache}), "versions": info}
    except SystemExit as exc:  # a peer that cannot run here is a row saying why
        return {"error": str(exc)[-1500:], "versions": info}
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


def summary(runs: list[dict], max_length: int) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "rss_mib")}
    last = runs[-1]
    bound = math.ceil(last["tokens"] / max_length)
    return {**med, "packs": last["packs"], "lower_bound": bound, "over_bound": last["packs"] - bound,
            "tokens": last["tokens"], "loss_tokens": last["loss_tokens"], "examples": last["examples"],
            "loss_share": last["loss_tokens"] / last["tokens"], "loads": [r["load"] for r in runs],
            "walls": [r["wall"] for r in runs]}


def make_image_chats(path: Path, coco: Path, records: int, seed: int = 0) -> None:
    """One COCO image + a question, one of its captions as the answer (the image set), images cycled."""
    rng = np.random.default_rng(seed)
    data = json.loads((coco / "annotations" / "captions_val2017.json").read_text())
    names = {im["id"]: coco / "val2017" / im["file_name"] for im in data["images"]}
    caps = [(names[a["image_id"]], a["caption"].strip()) for a in data["annotations"] if names[a["image_id"]].exists()]
    with open(path, "w") as f:
        for i in rng.integers(0, len(caps), size=records):
            image, cap = caps[int(i)]
            f.write(json.dumps({"messages": [{"role": "user", "content": "<image>Describe this image."},
                                             {"role": "assistant", "content": cap}], "images": [str(image)]}) + "\n")


def save_processor(tokdir: Path) -> None:
    """A full Qwen2-VL processor directory from packer's builtin qwen2-vl files (no hub): the tokenizer with its chat
    template, ``preprocessor_config.json`` (the image processor at the released Qwen2-VL-7B-Instruct values,
    packer's ``qwen2-vl`` profile's), ``video_preprocessor_config.json`` and ``processor_config.json``. The config
    files are written as JSON, not by the classes' ``save_pretrained``: packer's venv has no torchvision, which
    transformers' Qwen2-VL video processor (and its non-PIL image processor) import, and a peer's own transformers
    then loads the directory with ``AutoProcessor.from_pretrained`` like a downloaded checkpoint."""
    from packer.encode.tokenizers import load_tokenizer
    from packer.models.registry import get_profile

    tokenizer = load_tokenizer("qwen2-vl")
    tokenizer.save_pretrained(tokdir)
    prof = get_profile("qwen2-vl")
    common = {"patch_size": prof.patch_size, "merge_size": prof.merge_size, "temporal_patch_size":
              prof.temporal_patch_size, "image_mean": list(prof.image_mean), "image_std": list(prof.image_std),
              "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
              "do_convert_rgb": True, "resample": 3, "processor_class": "Qwen2VLProcessor"}
    image = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": prof.min_pixels,
             "max_pixels": prof.max_pixels, "size": {"shortest_edge": prof.min_pixels, "longest_edge": prof.max_pixels},
             **common}
    vmin, vmax = prof.video_min_pixels or 128 * 28 * 28, prof.video_max_pixels or 768 * 28 * 28  # class defaults
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": vmin, "max_pixels": vmax,
             "size": {"shortest_edge": vmin, "longest_edge": vmax}, **common}
    for name, data in (("preprocessor_config.json", image), ("video_preprocessor_config.json", video),
                       ("processor_config.json", {"processor_class": "Qwen2VLProcessor"})):
        (tokdir / name).write_text(json.dumps(data, indent=2) + "\n")
    if not (tokdir / "chat_template.jinja").exists():  # the processor's template: the tokenizer's (Qwen2-VL's own)
        (tokdir / "chat_template.jinja").write_text(tokenizer.chat_template)


def save_tokenizer(tokdir: Path) -> None:
    """packer's builtin qwen2-vl tokenizer as a full Qwen2-VL processor dir (``save_processor``) plus a 1-layer
    width-8 Qwen2: the CLIs that load a model before preparing data get one."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokdir.mkdir(parents=True, exist_ok=True)
    save_processor(tokdir)
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=1, num_key_value_heads=1,
                                 tie_word_embeddings=True)).save_pretrained(tokdir)


def peer_row(name: str, r: dict, bound_of) -> str:
    if "error" in r:
        return f"{name:18s} could not run here: {r['error'].strip().splitlines()[-1][:300] if r['error'].strip() else '?'}"
    cap = r.get("capacity")
    if r.get("packs") is None:
        return (f"{name:18s} {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU-s, peak RSS {r['rss_mib']:.0f} MiB; "
                f"{r.get('examples', 0):,} examples, {r.get('tokens', 0):,} tokens; {r.get('note', 'no packs')}; "
                f"{r.get('versions', '')}")
    bound = bound_of(r["tokens"], cap)
    return (f"{name:18s} {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU-s, peak RSS {r['rss_mib']:.0f} MiB; "
            f"{r.get('examples', 0):,} examples, {r['tokens']:,} tokens in {r['packs']:,} packs (lower bound {bound:,}: "
            f"+{r['packs'] - bound}); isolated: {r.get('isolated')}; load {r['load'][0]:.1f} -> {r['load'][1]:.1f}; "
            f"{r.get('versions', '')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--coco", type=Path,
                    default=Path(os.environ.get("PACKER_SHARED", REPO.parent / "shared")) / "data" / "coco-mini")
    ap.add_argument("--peers", default="packer,trl", help=f"sides to run: packer, trl, {', '.join(PEERS)}")
    ap.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "packer-peers",
                    help="where each peer's venv is created (reused when it exists)")
    ap.add_argument("--images", type=int, default=0, help="also an image set of this many image+caption chats")
    ap.add_argument("--image-sides", default="packer,llamafactory-neat", help="the sides run on the image set")
    ap.add_argument("--trl-child", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--peer-child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_child:
        name, corpus, out, length, procs, tokdir = args.peer_child
        if name.startswith("llamafactory"):
            llamafactory_child(corpus, out, int(length), int(procs), tokdir, neat=name.endswith("neat"))
        elif name == "ms-swift":
            swift_child(corpus, out, int(length), int(procs), tokdir)
        else:
            axolotl_child(corpus, out, int(length), int(procs), tokdir)
        return
    sys.path.insert(0, str(REPO))
    if args.trl_child:
        corpus, out, length, procs, tokdir = args.trl_child
        trl_child(corpus, out, int(length), int(procs), tokdir)
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO)}
    sides = args.peers.split(",")
    others = [p for p in sides if p in PEERS]
    args.venvs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "chats.jsonl"
        make_chats(corpus, args.coco, args.records)
        tokdir = Path(tmp) / "tokenizer"
        save_tokenizer(tokdir)
        print(f"{args.records:,} chats ({corpus.stat().st_size / 2**20:.1f} MiB JSONL), max_length {args.max_length}, "
              f"{args.num_proc} processes, {args.repeats} runs each (interleaved), load {os.getloadavg()[0]:.1f}")
        runs: dict[str, list[dict]] = {s: [] for s in ("packer", "trl") if s in sides}
        if "packer" in sides:  # numba compiles the kernels of this length's dtype into the checkout's cache once
            warm = Path(tmp) / "warm.jsonl"  # (~11 CPU-s): a first build in a fresh checkout would time them
            make_chats(warm, args.coco, 2000)
            packer_side(warm, Path(tmp) / "warm", args.max_length, args.num_proc, env)
        for i in range(args.repeats):
            for side, fn in (("packer", packer_side), ("trl", trl_side)):
                if side not in runs:
                    continue
                r = fn(corpus, Path(tmp) / f"{side}-{i}", args.max_length, args.num_proc, env)
                runs[side].append(r)
                print(f"  run {i + 1} {side:6s}: {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU-s, {r['rss_mib']:.0f} MiB, "
                      f"load {r['load'][0]:.1f} -> {r['load'][1]:.1f}", flush=True)
        s: dict = {side: summary(r, args.max_length) for side, r in runs.items()}
        for side, v in s.items():
            print(f"{side:6s} median: {v['wall']:.1f} s wall, {v['cpu']:.1f} CPU-s, peak RSS {v['rss_mib']:.0f} MiB; "
                  f"{v['examples']:,} examples, {v['tokens']:,} tokens in {v['packs']:,} packs (lower bound "
                  f"{v['lower_bound']:,}: +{v['over_bound']}); loss on {v['loss_tokens']:,} tokens "
                  f"({v['loss_share']:.1%})")
        if "packer" in s and "trl" in s:
            p, t = s["packer"], s["trl"]
            print(f"packer / TRL: wall {p['wall'] / t['wall']:.2f}x, CPU {p['cpu'] / t['cpu']:.2f}x, "
                  f"peak RSS {p['rss_mib'] / t['rss_mib']:.2f}x, packs {p['packs']:,} vs {t['packs']:,}")
            print("loss: packer on assistant turns (content + end-of-turn token); TRL's default on every token "
                  "(assistant_only_loss needs a template with generation markers)")
        bound_of = lambda tokens, cap: math.ceil(tokens / (cap or args.max_length))  # noqa: E731
        for name in others:  # once each: installing and running a peer takes minutes
            r = peer_side(name, corpus, Path(tmp) / name, args.max_length, args.num_proc, env, args.venvs, tokdir)
            s[name] = r
            print(peer_row(name, r, bound_of), flush=True)
        if args.images:
            images = Path(tmp) / "image_chats.jsonl"
            make_image_chats(images, args.coco, args.images)
            print(f"image set: {args.images:,} image+caption chats over {args.coco.name}'s val2017 images")
            s["images"] = {}
            for name in args.image_sides.split(","):
                if name == "packer":
                    cmd = [str(Path(sys.executable).parent / "packer"), "build", str(images), "-o",
                           str(Path(tmp) / "img-packer"), "--profile", "qwen2-vl", "--max-length",
                           str(args.max_length), "--overlong", "truncate", "--num-proc", str(args.num_proc),
                           "--overwrite", "--quiet"]
                    try:
                        r = measure(cmd, env)
                        t = json.loads((Path(tmp) / "img-packer" / "manifest.json").read_text())["totals"]
                        r.update(packs=t["packs"], tokens=t["tokens"], examples=t["examples"], isolated=True)
                    except SystemExit as exc:
                        r = {"error": str(exc)[-1500:]}
                elif name == "trl":
                    try:
                        r = trl_side(images, Path(tmp) / "img-trl", args.max_length, args.num_proc, env, tokdir)
                        r["isolated"] = True
                    except SystemExit as exc:  # TRL 1.16 refuses packing for vision datasets: the row says so
                        r = {"error": str(exc)[-1500:]}
                else:
                    r = peer_side(name, images, Path(tmp) / f"img-{name}", args.max_length, args.num_proc, env,
                                  args.venvs, tokdir)
                s["images"][name] = r
                print(peer_row(f"images {name}", r, bound_of), flush=True)
        print(json.dumps(s, default=str))


if __name__ == "__main__":
    main()
