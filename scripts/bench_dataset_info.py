"""What reading LLaMA-Factory's shapes costs: records/s parsed through a dataset_info.json spec (alpaca, sharegpt
with tool calls) against the same records written as packer's own chat records, one core.

    python scripts/bench_dataset_info.py [--records 20000] [--build DIR]

Parsing alone (formats.parse_record), and with ``--build DIR`` whole builds of the sharegpt+tools records
(``--profile text --tokenizer qwen2.5``, one process) through ``--dataset-info`` and as native JSONL, each
timed twice, alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from packer.formats import llamafactory, parse_record
from packer.formats.common import Ctx

ALPACA = {"file_name": "x.json"}
SHAREGPT = {"file_name": "x.json", "formatting": "sharegpt", "columns": {"messages": "conversations", "tools": "tools"}}
TOOLS = json.dumps([{"name": "calculate_age", "description": "Calculate the age", "parameters": {
    "type": "object", "properties": {"birthdate": {"type": "string"}}, "required": ["birthdate"]}}])


def records(n: int) -> dict[str, tuple[dict, list[dict]]]:
    alpaca = [{"instruction": f"Rewrite sentence {i} more formally.", "input": "" if i % 2 else f"it is {i}",
               "output": f"Sentence {i}, rewritten. " * 8} for i in range(n)]
    sharegpt = [{"conversations": [
        {"from": "human", "value": f"I was born in {1950 + i % 50}. How old am I?"},
        {"from": "function_call", "value": json.dumps({"name": "calculate_age", "arguments": {"birthdate": str(i)}})},
        {"from": "observation", "value": json.dumps({"age": i % 90})},
        {"from": "gpt", "value": f"You are {i % 90} years old."}], "tools": TOOLS} for i in range(n)]
    return {"alpaca": (ALPACA, alpaca), "sharegpt+tools": (SHAREGPT, sharegpt)}


def rate(objs: list[dict], **kw) -> float:
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        for i, obj in enumerate(objs, start=1):
            parse_record(obj, path="x.json", line=i, base_dir="/tmp", **kw)
        best = max(best, len(objs) / (time.perf_counter() - t))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--build", metavar="DIR", help="also time whole builds, inputs and outputs under DIR")
    args = ap.parse_args()
    shapes = records(args.records)
    for name, (entry, objs) in shapes.items():
        spec = llamafactory.dataset_spec(name, entry, "bench")
        native = [llamafactory.to_record(o, spec, Ctx("x.json", 1, "/tmp")) for o in objs]
        via, own = rate(objs, dataset=spec), rate(native)
        print(json.dumps({"shape": name, "records": len(objs), "dataset_info_rec_s": round(via),
                          "native_rec_s": round(own), "ratio": round(via / own, 2)}))
    if args.build:
        build_times(args.build, *shapes["sharegpt+tools"])


def build_times(root: str, entry: dict, objs: list[dict]) -> None:
    from packer.config import BuildConfig
    from packer.pipeline.build import build

    os.makedirs(root, exist_ok=True)
    spec = llamafactory.dataset_spec("glaive", entry, "bench")
    with open(os.path.join(root, "glaive.jsonl"), "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in objs)
    with open(os.path.join(root, "native.jsonl"), "w") as f:
        f.writelines(json.dumps(llamafactory.to_record(o, spec, Ctx("x", 1, root))) + "\n" for o in objs)
    with open(os.path.join(root, "dataset_info.json"), "w") as f:
        json.dump({"glaive": {**entry, "file_name": "glaive.jsonl"}}, f)
    options = {"profile": "text", "tokenizer": "qwen2.5", "max_length": 4096}
    configs = {"dataset_info": {"dataset_info": os.path.join(root, "dataset_info.json"), "datasets": ["glaive"]},
               "native": {"inputs": [os.path.join(root, "native.jsonl")]}}
    seconds: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(2):
        for name, inputs in configs.items():
            out = os.path.join(root, f"out-{name}")
            shutil.rmtree(out, ignore_errors=True)  # a finished output of the same build would be resumed: no work
            config = BuildConfig.from_dict({**inputs, **options, "output": out})
            t = time.perf_counter()
            build(config, progress=False)
            seconds[name].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in seconds.items()}
    print(json.dumps({"build_records": len(objs), **{f"{k}_s": round(v, 2) for k, v in best.items()},
                      "ratio": round(best["dataset_info"] / best["native"], 3)}))


if __name__ == "__main__":
    main()
