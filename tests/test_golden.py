"""Golden builds: a fixed corpus packs to the same bytes as it did before the package layout moved.

The sha256s below were recorded on main at bbb8e06 (before the layout issue's move), by running this file's
``write_corpus`` + ``BUILDS`` and printing ``_digests``. A change that alters any shard byte, the stats or the
rejects of these builds fails here; if a change *means* to alter them (a schema bump), re-record and say why
in the commit. Re-recorded once: rejects.jsonl, when the preference-pair input kind joined (the unknown_format
message lists the `chosen` field). Re-recorded once more, the shards only, for shard schema v2 (the video
issue): every shard gained the `videos` and `num_video_tokens` columns (empty lists and zeros here) and its
schema metadata says version 2; with those two columns dropped, every row group reads back equal to the v1
shards of main at 8098e90 (the digests recorded before; compared table by table), and rejects.jsonl and
stats.json are unchanged. Re-recorded a third time, the shards only, for shard schema v3 (issue 21): every shard
gained the `seq_lengths` column (TRL's padding-free collator reads it; null on rows with trees, images or mRoPE,
which is every row of qwen2-vl-mix and two of llava's three) and its schema metadata says version 3; with that
column dropped, every row group reads back equal to the v2 shards of main at 064c765 (which reproduced the digests
recorded before), and rejects.jsonl and stats.json are unchanged. Re-recorded a fourth time for shard schema v4
(issues 23 and 24, merged together): every shard gained the `loss_weights` column (null on every row: the corpus
has no weighted message) and the `audios` and `num_audio_tokens` columns (empty lists and zeros here), and its
schema metadata says version 4; with those three columns dropped, every row group reads back equal to the v3
shards of main at 7408506 (which reproduced the digests recorded before); the mix's stats.json gained each source's
loss_tokens, token_share, loss_token_share, packs and pack_share (nothing else changed in it), and rejects.jsonl
and llava's stats.json are unchanged. Re-recorded a fifth time, the shards only, for shard schema v5 (Qwen3-Omni,
issue 23): `mrope_position_ids` became list<float32> (whole numbers here: qwen2-vl's positions) and the audios
struct gained `padded_samples` (no clip here), and the schema metadata says version 5; with the mRoPE column cast
back to int32 and padded_samples dropped, every row group reads back equal to the v4 shards of main at 7c3163e
(which reproduced the digests recorded before; compared table by table), and rejects.jsonl and stats.json are
unchanged. Re-recorded a sixth time, the shards only, for shard schema v6 (issue 33's write floor): the
`mrope_position_ids` column is stored as `mrope_runs`, `mrope_bases` and `mrope_rest` (packer/shards/mrope.py;
all three null in llava's rows, which have no mRoPE) and the schema metadata says version 6; every row group read
back through `packer.shards.io.parquet_file` (the dense column rebuilt) equals the v5 shards of main at a2e2c77
(which reproduced the digests recorded before; compared row group by row group, cast to the same schema), and
rejects.jsonl and stats.json are unchanged. tests/report/test_verify.py keeps a v5-written build as a read test.

The corpus holds text, chats (string and multi-part content), LLaVA conversations, message trees (nested),
real COCO images (by relative path and inline as data URLs), a weighted two-source mixture and one line of each
common reject. Resolved image paths are stored in the shards (and named in reject messages), so the corpus is
always written to the same absolute directory, ``/tmp/packer-golden/NAME``, held under a file lock while a build
runs there (parallel test runs on one machine wait for each other).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli import cli

COCO_FILES = ("val2017/000000000139.jpg", "val2017/000000000802.jpg")  # and the first train2017 image
WORDS = "a cat dog red bus on the street near two people with an umbrella sitting in kitchen table".split()

# name -> (command-line arguments after `packer build`, expected sha256 of each output file)
BUILDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "qwen2-vl-mix": (
        ["--source", "chat=chats.jsonl@2", "--source", "misc=misc.jsonl@0.5", "--profile", "qwen2-vl",
         "--max-length", "1024", "--max-vision-tokens", "900", "--image-root", ".", "--num-proc", "2",
         "--rows-per-shard", "4", "--rows-per-row-group", "2", "--seed", "7"],
        {
            "shard-00000.parquet": "55d0596115083abd3e908f135dd7f3f037f06cfb32060c5633e7e948f933e43e",
            "shard-00001.parquet": "2fb5787ab4c2f481e70edc144f49f80653768b94f7ae696629554e4ee67fe2df",
            "rejects.jsonl": "a72ab3151e78102393cd7ca72ed2f7e8f734f2406821129018b90ed2109167e6",
            "stats.json": "aacfd06a4a5e59acd6614bcf565d672d4bf146232010bed76c889eeb4f8ca7f5",
        },
    ),
    "llava": (
        ["chats.jsonl", "--profile", "llava", "--tokenizer", "qwen2-vl", "--max-length", "2048", "--image-root", ".",
         "--overlong", "truncate"],
        {
            "shard-00000.parquet": "23c5afaffd66769ab192cc671bb8c73f9f5b98eac5030fb8c69a638e127b3ac3",
            "rejects.jsonl": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "stats.json": "2c59b1d0ddcb8a8bc68a2cb761fbc59e04edcfd16b92bcb063cc1e52ec7e5bfb",
        },
    ),
}


def _coco_images(coco: Path) -> list[Path]:
    first_train = sorted((coco / "train2017").glob("*.jpg"))[0]
    return [coco / COCO_FILES[0], coco / COCO_FILES[1], first_train]


def write_corpus(root: Path, coco: Path) -> None:
    """The fixed corpus: ``chats.jsonl`` (chats, trees, LLaVA, images) and ``misc.jsonl`` (text, rejects)."""
    rnd = random.Random(1234)
    (root / "img").mkdir(parents=True, exist_ok=True)
    names = []
    for i, src in enumerate(_coco_images(coco)):
        shutil.copy(src, root / "img" / f"{i}.jpg")
        names.append(f"img/{i}.jpg")
    inline = "data:image/jpeg;base64," + base64.b64encode((root / names[2]).read_bytes()).decode()

    def words(n: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(n))

    chats: list = []
    for i in range(30):
        chats.append({"messages": [{"role": "user", "content": words(5 + 7 * (i % 9))},
                                   {"role": "assistant", "content": words(3 + 5 * (i % 4))}]})
    for i, name in enumerate(names[:2]):
        chats.append({"messages": [
            {"role": "system", "content": "You describe images."},
            {"role": "user", "content": [{"type": "image", "image": name}, {"type": "text", "text": words(6)}]},
            {"role": "assistant", "content": words(10 + i)}]})
    chats.append({"messages": [{"role": "user", "content": [{"type": "image", "image": inline},
                                                           {"type": "text", "text": "Caption it."}]}],
                  "branches": [[{"role": "assistant", "content": words(8)}],
                               [{"role": "assistant", "content": words(12)}],
                               {"messages": [{"role": "assistant", "content": words(4)}],
                                "branches": [[{"role": "user", "content": "Why?"},
                                              {"role": "assistant", "content": words(6)}],
                                             [{"role": "user", "content": "Sure?"},
                                              {"role": "assistant", "content": words(3), "loss": False},
                                              {"role": "user", "content": "Really?"},
                                              {"role": "assistant", "content": words(5)}]]}]})
    chats.append({"conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                                    {"from": "gpt", "value": words(9)},
                                    {"from": "human", "value": "More?"}, {"from": "gpt", "value": words(4)}],
                  "image": names[1]})
    misc: list = [{"text": words(20 + 30 * i)} for i in range(8)]
    misc += [
        "{not json",
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "img/missing.jpg"}]},
                      {"role": "assistant", "content": "x"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"unknown": 1},
        {"messages": [{"role": "robot", "content": "beep"}]},
        {"text": words(2000)},  # overlong at --max-length 1024
    ]
    for name, records in (("chats.jsonl", chats), ("misc.jsonl", misc)):
        with open(root / name, "w") as f:
            for r in records:
                f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def _digests(out: Path) -> dict[str, str]:
    files = sorted(p.name for p in out.glob("shard-*.parquet")) + ["rejects.jsonl", "stats.json"]
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in files}


def run_golden_build(root: Path, name: str) -> dict[str, str]:
    args, _ = BUILDS[name]
    result = CliRunner().invoke(cli, ["build", *args, "--output", f"out-{name}", "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    manifest = json.loads((root / f"out-{name}" / "manifest.json").read_text())
    assert manifest["totals"]["examples"] > 0
    return _digests(root / f"out-{name}")


GOLDEN_ROOT = Path("/tmp/packer-golden")


@contextlib.contextmanager
def golden_dir(name: str, coco: Path):
    """A fresh corpus in ``/tmp/packer-golden/NAME``, the working directory while held (locked)."""
    GOLDEN_ROOT.mkdir(parents=True, exist_ok=True)
    with open(GOLDEN_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        root = GOLDEN_ROOT / name
        shutil.rmtree(root, ignore_errors=True)
        write_corpus(root, coco)
        with contextlib.chdir(root):
            yield root


@pytest.mark.parametrize("name", list(BUILDS))
def test_golden_build_bytes(name, coco_dir):
    with golden_dir(name, coco_dir) as root:
        got = run_golden_build(root, name)
    assert got == BUILDS[name][1]


if __name__ == "__main__":  # re-record: python tests/test_golden.py (prints the digests to paste above)
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import COCO

    for build_name in BUILDS:
        with golden_dir(build_name, COCO) as d:
            print(build_name, json.dumps(run_golden_build(d, build_name), indent=12))
