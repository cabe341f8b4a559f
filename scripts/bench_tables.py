"""Reading table inputs: rows/s of scan + read + parse (no tokenizer) for Parquet with small and big row groups,
against the same records as JSONL. `python scripts/bench_tables.py [ROWS]` (docs/benchmarks.md)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer.config import BuildConfig
from packer.pipeline.stages import _chunk_records, scan_chunks


def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    recs = [{"messages": [{"role": "user", "content": f"question {i} " * 8},
                          {"role": "assistant", "content": f"answer {i} " * 8}]} for i in range(n)]
    (tmp / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    table = pa.Table.from_pylist(recs)
    files = {"jsonl": tmp / "r.jsonl"}
    for rg in (1000, 100_000):
        pq.write_table(table, tmp / f"rg{rg}.parquet", row_group_size=rg)
        files[f"parquet, row groups of {rg:,}"] = tmp / f"rg{rg}.parquet"
    for name, path in files.items():
        cfg = BuildConfig.from_inputs([str(path)], str(tmp / "out"), profile="text")
        t0 = time.perf_counter()
        rows = sum(1 for c in scan_chunks(cfg) for _ in _chunk_records(c, cfg, str(tmp)))
        dt = time.perf_counter() - t0
        print(f"{name:32s} {rows:,} rows in {dt:.1f} s = {rows / dt:,.0f} rows/s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
