"""LLaMA-Factory's dataset_info.json: entries -> specs, records -> packer records, on excerpts of its own demo
data (tests/data/llamafactory, Apache-2.0), and a build through ``--dataset-info`` that packs exactly what the
same records written as packer's own JSONL pack."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packer.cli import cli
from packer.config import BuildConfig, dataset_sources
from packer.errors import ConfigError, RecordError
from packer.formats import parse_record
from packer.formats.llamafactory import dataset_spec
from tests.formats.conftest import IMG_A, IMG_B

DATA = Path(__file__).parents[1] / "data" / "llamafactory"
INFO = json.loads((DATA / "dataset_info.json").read_text())
INFO["rlaif_mm"] = {**INFO["mllm_demo"], "ranking": True,  # sharegpt ranking with role/content tags, no function tag
                    "columns": {**INFO["mllm_demo"]["columns"], "chosen": "chosen", "rejected": "rejected"}}


@pytest.fixture()
def lf(tmp_path: Path) -> Path:
    """A copy of tests/data/llamafactory with real COCO images as mllm_demo_data/1..3.jpg."""
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    (root / "mllm_demo_data").mkdir()
    for name, src in (("1.jpg", IMG_A), ("2.jpg", IMG_B), ("3.jpg", IMG_A)):
        shutil.copy(src, root / "mllm_demo_data" / name)
    return root


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def convert(record: dict, entry: dict, root: Path | str = DATA, line: int = 1):
    from packer.formats import llamafactory
    from packer.formats.common import Ctx

    return llamafactory.to_record(record, dataset_spec("t", entry, "t"), Ctx("t.json", line, str(root)))


# ------------------------------------------------------------------------------------------------ specs
def test_columns_given_unset_every_column_they_do_not_name():
    spec = dataset_spec("c4_demo", INFO["c4_demo"], "x")
    assert spec["columns"]["prompt"] == "text" and spec["columns"]["query"] is None
    assert spec["columns"]["response"] is None  # a pretraining dataset
    spec = dataset_spec("alpaca_en_demo", INFO["alpaca_en_demo"], "x")  # no columns: LLaMA-Factory's defaults
    assert (spec["formatting"], spec["columns"]["prompt"], spec["columns"]["query"], spec["columns"]["response"]) == (
        "alpaca", "instruction", "input", "output")
    spec = dataset_spec("mllm_demo", INFO["mllm_demo"], "x")  # tags given: the ones not named are unset
    assert spec["tags"]["user_tag"] == "user" and spec["tags"]["function_tag"] is None


@pytest.mark.parametrize(("entry", "match"), [
    (INFO["kto_en_demo"], "KTO dataset.*kto_tag 'label'"),
    ({"file_name": "x.json", "formatting": "openai"}, "formatting 'openai'.*messages"),
    ({"file_name": "x.json", "num_samples": 10}, "num_samples"),
    ({"file_name": "x.json", "ranking": True, "columns": {"prompt": "q"}}, "without 'chosen' and 'rejected'"),
])
def test_entries_packer_cannot_read_as_asked_are_refused(entry, match):
    with pytest.raises(ConfigError, match=match):
        dataset_spec("d", entry, "info")


def test_dataset_sources_resolve_files_weights_and_hub_entries(lf):
    info = str(lf / "dataset_info.json")
    s = dataset_sources(info, ["mllm_demo", "alpaca_en_demo@0.5"])
    assert [(x["name"], x["paths"], x["weight"]) for x in s] == [
        ("mllm_demo", [str(lf / "mllm_demo.jsonl")], 1.0), ("alpaca_en_demo", [str(lf / "alpaca_en_demo.jsonl")], 0.5)]
    assert s[0]["image_root"] == str(lf)  # LLaMA-Factory's media_dir: the dataset_info.json's directory
    with pytest.raises(ConfigError, match=r"hf_hub_url entry \('llamafactory/alpaca_en'\).*--dataset alpaca_en=DIR"):
        dataset_sources(info, ["alpaca_en"])
    local = dataset_sources(info, [f"rlaif_v={lf / 'rlaif_v_local.jsonl'}@2"])  # a Hub entry read from a local copy
    assert local[0]["paths"] == [str(lf / "rlaif_v_local.jsonl")] and local[0]["weight"] == 2.0
    assert local[0]["dataset"]["ranking"] and local[0]["dataset"]["columns"]["images"] == "image"
    (lf / "parts").mkdir()  # a folder file_name: every file in it, as LLaMA-Factory lists it
    info_dir = json.loads((lf / "dataset_info.json").read_text())
    (lf / "info2.json").write_text(json.dumps({"parts": {**info_dir["alpaca_en_demo"], "file_name": "parts"}}))
    assert dataset_sources(str(lf / "info2.json"), ["parts"])[0]["paths"] == [str(lf / "parts" / "*")]
    with pytest.raises(ConfigError, match="'nope' is not in"):
        dataset_sources(info, ["nope"])
    with pytest.raises(ConfigError, match="named twice"):
        dataset_sources(info, ["mllm_demo", "mllm_demo@2"])


# ---------------------------------------------------------------------------------------------- records
def test_alpaca_joins_instruction_and_input_and_omits_an_empty_input():
    no_input, _, with_input, _ = _records("alpaca_en_demo.jsonl")
    got = convert(no_input, INFO["alpaca_en_demo"])
    assert got == {"messages": [{"role": "user", "content": no_input["instruction"]},
                                {"role": "assistant", "content": no_input["output"]}]}
    got = convert(with_input, INFO["alpaca_en_demo"])
    assert got["messages"][0]["content"] == with_input["instruction"] + "\n" + with_input["input"]


def test_alpaca_history_and_system_are_earlier_turns():
    got = convert(_records("history.jsonl")[0], INFO["history_demo"])
    assert got["messages"] == [
        {"role": "system", "content": "You translate."},
        {"role": "user", "content": "Say hello in German."}, {"role": "assistant", "content": "Hallo."},
        {"role": "user", "content": "And in Spanish?"}, {"role": "assistant", "content": "Hola."},
        {"role": "user", "content": "And in French?"}, {"role": "assistant", "content": "Bonjour."}]
    assert [m["role"] for m in convert(_records("history.jsonl")[1], INFO["history_demo"])["messages"]] == [
        "user", "assistant"]  # an empty system prompt and history add nothing


def test_pretraining_entry_is_text_and_placeholders_without_a_media_column_are_text():
    assert convert({"text": "Some web page."}, INFO["c4_demo"]) == {"text": "Some web page."}
    html = {"instruction": "Embed a clip with <video>.", "input": "", "output": "<video src=a.mp4>"}
    assert convert(html, INFO["alpaca_en_demo"])["messages"][0]["content"] == "Embed a clip with <video>."


def test_sharegpt_function_call_and_observation_become_tool_calls_and_a_tool_turn():
    rec = _records("glaive_toolcall_en_demo.jsonl")[0]
    got = convert(rec, INFO["glaive_toolcall_en_demo"])
    assert [m["role"] for m in got["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert got["messages"][1]["tool_calls"] == [
        {"type": "function", "function": {"name": "calculate_age", "arguments": {"birthdate": "1990-05-15"}}}]
    assert got["messages"][2]["content"] == '{"age": 31}'
    # tools: a JSON string of bare function schemas, wrapped as OpenAI's (and LLaMA-Factory's) form
    assert got["tools"] == [{"type": "function", "function": schema} for schema in json.loads(rec["tools"])]
    assert "tools" not in convert(_records("glaive_toolcall_en_demo.jsonl")[2], INFO["glaive_toolcall_en_demo"])


def test_parallel_function_calls_are_a_list():
    rec = {"conversations": [{"from": "human", "value": "Both?"},
                             {"from": "function_call", "value": json.dumps([{"name": "a", "arguments": {}},
                                                                            {"name": "b", "arguments": {"x": 1}}])},
                             {"from": "observation", "value": "ok"}, {"from": "gpt", "value": "Done."}]}
    got = convert(rec, INFO["glaive_toolcall_en_demo"])
    assert [c["function"]["name"] for c in got["messages"][1]["tool_calls"]] == ["a", "b"]


def test_sharegpt_ranking_is_a_preference_pair_and_a_first_system_turn_the_system_prompt():
    rec = _records("dpo_en_demo.jsonl")[2]
    assert rec["conversations"][0]["from"] == "system"
    got = convert(rec, INFO["dpo_en_demo"])
    assert got["prompt"][0] == {"role": "system", "content": rec["conversations"][0]["value"]}
    assert [m["role"] for m in got["prompt"]] == ["system", "user"]
    assert got["chosen"] == [{"role": "assistant", "content": rec["chosen"]["value"]}]
    assert got["rejected"] == [{"role": "assistant", "content": rec["rejected"]["value"]}]


def test_alpaca_ranking_with_an_image_from_a_hub_entry_read_locally(lf):
    got = convert(_records("rlaif_v_local.jsonl")[0], INFO["rlaif_v"], lf)
    assert got == {"prompt": [{"role": "user", "content": "<image>What is in the picture?"}],
                   "chosen": [{"role": "assistant", "content": "Two people on a field."}],
                   "rejected": [{"role": "assistant", "content": "A cat on a sofa."}],
                   "images": ["mllm_demo_data/1.jpg"]}


@pytest.mark.parametrize(("record", "entry", "reason", "match"), [
    ({"messages": [{"role": "user", "content": "<image><image>Hi"}, {"role": "assistant", "content": "Yo"}],
      "images": ["a.jpg"]}, "mllm_demo", "image_count_mismatch", "lists 1 images .* has 2 <image> placeholders"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],
      "images": ["a.jpg", "b.jpg"]}, "mllm_demo", "image_count_mismatch", "lists 2 images .* has 0 <image>"),
    ({"messages": [{"role": "user", "content": "<video>Hi"}, {"role": "assistant", "content": "Yo"}], "videos": []},
     "mllm_video_demo", "image_count_mismatch", "lists 0 videos .* has 1 <video>"),
    ({"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]},
     "glaive_toolcall_en_demo", "unknown_role", r"conversations\[1\] has from 'human'.*'gpt' or 'function_call'"),
    ({"conversations": [{"from": "human", "value": "a"}]}, "glaive_toolcall_en_demo", "wrong_type",
     "ending with an assistant turn, got 1 turns"),
    ({"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "get_x()"}]},
     "glaive_toolcall_en_demo", "wrong_type", r"conversations\[1\] \(function_call\) is not JSON"),
    ({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "tools": "[{"},
     "glaive_toolcall_en_demo", "wrong_type", "'tools' is not JSON"),
    ({"instruction": "a", "input": "", "output": None}, "alpaca_en_demo", "empty_messages", "no response"),
    ({"instruction": "", "input": "", "output": "b"}, "alpaca_en_demo", "empty_messages", "no instruction"),
    ({"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "a"}, "rejected": "b"},
     "dpo_en_demo", "wrong_type", "'rejected' must be one 'gpt' turn"),
    ({"messages": [{"role": "user", "content": "q"}], "chosen": {"content": "a"}, "rejected": {"content": "b"}},
     "rlaif_mm", "wrong_type", "'chosen' must be one 'assistant' turn"),
])
def test_bad_records_are_rejects_that_say_what_and_where(record, entry, reason, match):
    with pytest.raises(RecordError, match=match) as e:
        convert(record, INFO[entry], line=7)
    assert e.value.reason == reason and (e.value.path, e.value.line) == ("t.json", 7)


def test_parse_record_reads_a_dataset_record_as_a_packer_example(lf):
    spec = dataset_spec("mllm_demo", INFO["mllm_demo"], "x")
    ex = parse_record(_records("mllm_demo.jsonl")[0], path="m.jsonl", line=1, base_dir="/nowhere",
                      image_root=str(lf), dataset=spec)
    msgs = ex.root.messages
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert [len(m.images) for m in msgs] == [1, 0, 1, 0]
    assert msgs[0].images[0].path == str(lf / "mllm_demo_data" / "1.jpg")


# ------------------------------------------------------------------------------------------------ build
NATIVE = {  # the same records as packer's own JSONL, written by hand from the files above
    "mllm_demo": [
        {"messages": [{"role": "user", "content": "<image>Who are they?"},
                      {"role": "assistant", "content": "They're Kane and Gretzka from Bayern Munich."},
                      {"role": "user", "content": "What are they doing?<image>"},
                      {"role": "assistant", "content": "They are celebrating on the soccer field."}],
         "images": ["mllm_demo_data/1.jpg", "mllm_demo_data/1.jpg"]},
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Who is he?"}]},
                      {"role": "assistant", "content": "He's Thomas Muller from Bayern Munich."},
                      {"role": "user", "content": "Why is he on the ground?"},
                      {"role": "assistant", "content": "Because he's sliding on his knees to celebrate."}],
         "images": ["mllm_demo_data/2.jpg"]}],
    "history_demo": [
        {"messages": [{"role": "system", "content": "You translate."},
                      {"role": "user", "content": "Say hello in German."}, {"role": "assistant", "content": "Hallo."},
                      {"role": "user", "content": "And in Spanish?"}, {"role": "assistant", "content": "Hola."},
                      {"role": "user", "content": "And in French?"}, {"role": "assistant", "content": "Bonjour."}]}],
    "rlaif_v": [
        {"prompt": [{"role": "user", "content": "<image>What is in the picture?"}],
         "chosen": [{"role": "assistant", "content": "Two people on a field."}],
         "rejected": [{"role": "assistant", "content": "A cat on a sofa."}], "images": ["mllm_demo_data/1.jpg"]}],
    "glaive_toolcall_en_demo": [
        {"tools": [{"type": "function", "function": {
            "name": "calculate_age", "description": "Calculate the age based on birthdate",
            "parameters": {"type": "object", "properties": {"birthdate": {
                "type": "string", "description": "The birthdate in YYYY-MM-DD format"}}, "required": ["birthdate"]}}}],
         "messages": [{"role": "user", "content": "Hi, I was born on 1990-05-15. Can you tell me how old I am today?"},
                      {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                          "name": "calculate_age", "arguments": {"birthdate": "1990-05-15"}}}]},
                      {"role": "tool", "content": "{\"age\": 31}"},
                      {"role": "assistant", "content": "Based on the birthdate you provided, you are 31 years old today."}]}],
}
FILES = {"mllm_demo": "mllm_demo.jsonl", "history_demo": "history.jsonl", "rlaif_v": "rlaif_v_local.jsonl",
         "glaive_toolcall_en_demo": "glaive_toolcall_en_demo.jsonl"}
BUILDS = {  # Qwen2-VL's own template for images; Qwen2.5's for tool calls (Qwen2-VL's has no tools)
    "images": (["mllm_demo", "history_demo", "rlaif_v"], ["--profile", "qwen2-vl", "--max-pixels", str(64 * 28 * 28)]),
    "tools": (["glaive_toolcall_en_demo", "history_demo"], ["--profile", "text", "--tokenizer", "qwen2.5"]),
}


def _rows(out: Path) -> list[str]:
    """Every shard row as JSON, less the example ids and sources (file names and source names differ)."""
    rows = [r for f in sorted(out.glob("shard-*.parquet")) for r in pq.read_table(f).to_pylist()]
    for r in rows:
        del r["example_ids"], r["example_sources"]
    return [json.dumps(r, sort_keys=True, default=str) for r in rows]


@pytest.mark.parametrize("kind", BUILDS)
def test_dataset_info_build_packs_what_the_same_native_records_pack(lf, tmp_path, kind):
    names, options = BUILDS[kind]
    native = []
    for name in names:  # each dataset's file keeps the records NATIVE writes out
        lines = (lf / FILES[name]).read_text().splitlines()[: len(NATIVE[name])]
        (lf / FILES[name]).write_text("".join(line + "\n" for line in lines))
        native += NATIVE[name]
    (lf / "native.jsonl").write_text("".join(json.dumps(r) + "\n" for r in native))
    args = ["--dataset-info", str(lf / "dataset_info.json")]
    for name in names:
        args += ["--dataset", f"rlaif_v={lf / FILES[name]}" if name == "rlaif_v" else name]
    common = ["--max-length", "4096", "--rows-per-shard", "2", "-q", *options]
    runner = CliRunner()
    got = runner.invoke(cli, ["build", *args, "-o", str(tmp_path / "lf"), *common])
    assert got.exit_code == 0, got.output
    want = runner.invoke(cli, ["build", str(lf / "native.jsonl"), "-o", str(tmp_path / "native"), *common])
    assert want.exit_code == 0, want.output
    manifest = json.loads((tmp_path / "lf" / "manifest.json").read_text())
    assert manifest["totals"]["examples"] == len(native) and manifest["totals"]["rejected"] == 0
    assert [s["name"] for s in manifest["config"]["sources"]] == names
    assert _rows(tmp_path / "lf") == _rows(tmp_path / "native")  # ids, labels, positions, media, byte for byte
    # verify re-reads every record with its dataset's mapping (the manifest keeps it) and re-tokenizes it
    inputs = [x for name in names for x in ("--input", str(lf / FILES[name]))]
    check = runner.invoke(cli, ["verify", str(tmp_path / "lf"), *inputs, "--tokenizer-check", "all"])
    assert check.exit_code == 0, check.output
    assert f"{len(native)} input records ({len(native)} re-tokenized" in check.output
    shown = runner.invoke(cli, ["inspect", str(tmp_path / "lf"), "--example", f"{lf / 'history.jsonl'}:1", "--ids"])
    assert shown.exit_code == 0 and "history.jsonl:1" in shown.output, shown.output


def test_kto_and_hub_entries_stop_the_build_naming_the_entry(lf, tmp_path):
    runner = CliRunner()
    for name, match in (("kto_en_demo", "KTO dataset"), ("alpaca_en", "hf_hub_url entry")):
        got = runner.invoke(cli, ["build", "--dataset-info", str(lf / "dataset_info.json"), "--dataset", name,
                                  "-o", str(tmp_path / name), "-q"])
        assert got.exit_code == 1 and match in got.output, got.output


def test_yaml_dataset_info_and_datasets(lf, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"dataset_info: {lf / 'dataset_info.json'}\ndatasets: [alpaca_en_demo@2, "
                   f"{{name: rlaif_v, path: {lf / 'rlaif_v_local.jsonl'}}}]\noutput: {tmp_path / 'o'}\n")
    config = BuildConfig.from_yaml(cfg)
    assert [(s.name, s.weight, s.dataset["formatting"]) for s in config.sources] == [
        ("alpaca_en_demo", 2.0, "alpaca"), ("rlaif_v", 1.0, "alpaca")]
    again = BuildConfig.from_dict(json.loads(json.dumps(config.to_dict())))  # the manifest's round trip
    assert again == config
    plain = BuildConfig.from_inputs(["x.jsonl"], "o")
    assert "dataset" not in plain.to_dict()["sources"][0]  # builds without datasets keep their manifests


def test_online_packing_reads_dataset_info_sources_with_their_mapping(lf, tmp_path):
    from packer.train.online import OnlinePackedDataset

    config = BuildConfig.from_dict({"dataset_info": str(lf / "dataset_info.json"), "output": str(tmp_path / "o"),
                                    "datasets": ["glaive_toolcall_en_demo", "alpaca_en_demo"], "profile": "text",
                                    "tokenizer": "qwen2.5", "max_length": 4096})
    rejects = tmp_path / "rejects.jsonl"
    rows = list(OnlinePackedDataset(config, pool_size=4, load_images=False, rejects_path=rejects))
    ids = [e for r in rows for e in r["example_ids"]]
    assert len(ids) == 7 and not (rejects.exists() and rejects.read_text())  # 3 tool-call records + 4 alpaca


def test_llamafactorys_own_json_arrays_pack_as_their_jsonl_twins(lf, tmp_path):
    """dataset_info.json's file names as LLaMA-Factory ships them (``*.json``: pretty-printed arrays, as its
    data/ holds them), against the same records one per line."""
    arrays = lf  # beside the JSONL twins, so that media paths resolve alike
    info = json.loads((arrays / "dataset_info.json").read_text())
    names = ["mllm_demo", "alpaca_en_demo", "dpo_en_demo", "history_demo"]
    for name in names:
        jsonl = arrays / info[name]["file_name"]
        records = [json.loads(line) for line in jsonl.read_text().splitlines()]
        info[name]["file_name"] = jsonl.with_suffix(".json").name
        (arrays / info[name]["file_name"]).write_text(json.dumps(records, indent=2, ensure_ascii=False))
    (arrays / "dataset_info_arrays.json").write_text(json.dumps(info, indent=2))
    common = ["--profile", "qwen2-vl", "--max-pixels", str(64 * 28 * 28), "--max-length", "4096", "-q",
              *[x for name in names for x in ("--dataset", name)]]
    runner = CliRunner()
    for info_file, out in (("dataset_info.json", "out_lines"), ("dataset_info_arrays.json", "out_arrays")):
        got = runner.invoke(cli, ["build", "--dataset-info", str(lf / info_file), "-o", str(tmp_path / out), *common])
        assert got.exit_code == 0, got.output
    assert _rows(tmp_path / "out_arrays") == _rows(tmp_path / "out_lines")
    totals = json.loads((tmp_path / "out_arrays" / "manifest.json").read_text())["totals"]
    assert totals["examples"] == 3 + 4 + 3 + 2 and totals["rejected"] == 0
    inputs = [x for name in names for x in ("--input", str(arrays / info[name]["file_name"]))]
    check = runner.invoke(cli, ["verify", str(tmp_path / "out_arrays"), *inputs, "--tokenizer-check", "all"])
    assert check.exit_code == 0, check.output
    assert "12 input records (12 re-tokenized" in check.output  # each array element re-read with its mapping
    shown = runner.invoke(cli, ["inspect", str(tmp_path / "out_arrays"), "--example",
                                f"{arrays / 'mllm_demo.json'}:2", "--ids"])
    assert shown.exit_code == 0 and "mllm_demo.json:2" in shown.output, shown.output


def test_a_hub_entry_reads_a_local_snapshot_with_embedded_images(tmp_path, coco_images):
    """llava_1k_en (an hf_hub_url entry of LLaMA-Factory's dataset_info.json, verbatim) pointed at a downloaded
    Hub snapshot whose Parquet holds the images as ``datasets.Image`` bytes; its ``subset`` picks the snapshot's
    config of that name, as ``load_dataset(name="en")`` does (the other config's rows are not packed)."""
    from datasets import Dataset, Features, Image, Value

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    entry = {"hf_hub_url": "BUAADreamer/llava-en-zh-2k", "subset": "en", "formatting": "sharegpt",
             "columns": {"messages": "messages", "images": "images"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps({"llava_1k_en": entry}))
    jpeg = coco_images[0].read_bytes()
    rows = [{"messages": [{"role": "user", "content": "<image>What is this?"}, {"role": "assistant", "content": "A street."}],
             "images": [{"bytes": jpeg, "path": None}]},
            {"messages": [{"role": "user", "content": "What is this?"}, {"role": "assistant", "content": "?"}],
             "images": [{"bytes": jpeg, "path": None}]}]  # row 2: an image but no placeholder
    features = Features({"messages": [{"role": Value("string"), "content": Value("string")}], "images": [Image()]})
    for config, config_rows in (("en", rows), ("zh", rows[:1] * 3)):
        (tmp_path / "snap" / config).mkdir(parents=True)
        Dataset.from_list(config_rows, features=features).to_parquet(
            str(tmp_path / "snap" / config / "train-00000-of-00001.parquet"))
    (tmp_path / "snap" / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  data_files:\n  - split: train\n    path: en/train-*\n"
        "- config_name: zh\n  data_files:\n  - split: train\n    path: zh/train-*\n---\n")
    out = tmp_path / "out"
    got = CliRunner().invoke(cli, ["build", "--dataset-info", str(tmp_path / "dataset_info.json"), "--dataset",
                                   f"llava_1k_en={tmp_path / 'snap'}", "-o", str(out), "--max-pixels",
                                   str(64 * 28 * 28), "-q"])
    assert got.exit_code == 0, got.output
    row = pq.read_table(next(out.glob("shard-*.parquet"))).to_pylist()[0]
    assert [im["data"] for im in row["images"]] == [jpeg]  # embedded bytes, kept as they are
    assert json.loads((out / "stats.json").read_text())["examples"] == 1  # en's one good row, none of zh's three
    reject = json.loads((out / "rejects.jsonl").read_text())
    assert (Path(reject["path"]).parent.name, Path(reject["path"]).name, reject["line"], reject["reason"]) == (
        "en", "train-00000-of-00001.parquet", 2, "image_count_mismatch")
    assert "lists 1 images ('images') but its text has 0 <image>" in reject["message"]


def test_a_hub_entrys_subset_split_and_folder_are_followed_or_refused(tmp_path):
    """LLaMA-Factory loads a Hub entry with ``load_dataset(name=subset, split=split, data_dir=folder)``: a local
    snapshot gives that config's split, or a ConfigError naming the entry, never the default config's rows."""
    snap = tmp_path / "snap"
    for config, split in (("en", "train"), ("en", "test"), ("zh", "train")):
        (snap / config).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"instruction": [f"{config} {split}"], "output": ["ok"]}),
                       snap / config / f"{split}-00000-of-00001.parquet")
    (snap / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  data_files:\n  - split: train\n    path: en/train-*\n"
        "  - split: test\n    path: en/test-*\n- config_name: zh\n  data_files:\n  - split: train\n"
        "    path: zh/train-*\n---\n")
    entries = {"d": {"hf_hub_url": "x/y", "subset": "en", "split": "test"}, "z": {"hf_hub_url": "x/y", "subset": "zh"},
               "fr": {"hf_hub_url": "x/y", "subset": "fr"}, "dev": {"hf_hub_url": "x/y", "split": "dev"},
               "f": {"hf_hub_url": "x/y", "folder": "en"}, "plain": {"hf_hub_url": "x/y"}}
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps(entries))
    assert dataset_sources(str(info), [f"d={snap}"])[0]["paths"] == [str(snap / "en" / "test-00000-of-00001.parquet")]
    assert dataset_sources(str(info), [f"z={snap}"])[0]["paths"] == [str(snap / "zh" / "train-00000-of-00001.parquet")]
    assert dataset_sources(str(info), [f"plain={snap}"])[0]["paths"] == [str(snap)]  # the build's own rule
    with pytest.raises(ConfigError, match=r"'fr' \(subset 'fr', split None\).*no config named 'fr'.*\['en', 'zh'\]"):
        dataset_sources(str(info), [f"fr={snap}"])
    with pytest.raises(ConfigError, match=r"has splits \['train', 'test'\] and none named 'dev'"):
        dataset_sources(str(info), [f"dev={snap}"])
    with pytest.raises(ConfigError, match=r"sets folder 'en'.*--dataset f=PATH/en/\*\.parquet"):
        dataset_sources(str(info), [f"f={snap}"])


def test_dataset_without_dataset_info_is_a_usage_error(tmp_path):
    got = CliRunner().invoke(cli, ["build", "--dataset", "mllm_demo", "-o", str(tmp_path / "o")])
    assert got.exit_code == 2 and "--dataset names a dataset of --dataset-info FILE" in got.output


def test_columns_with_only_dataset_info_sources_is_refused(lf, tmp_path):
    """--columns maps packer's own inputs; a dataset_info dataset has its entry's columns: said, never ignored."""
    got = CliRunner().invoke(cli, ["build", "--dataset-info", str(lf / "dataset_info.json"), "--dataset", "mllm_demo",
                                   "--columns", "messages=conversations", "-o", str(tmp_path / "o")])
    assert got.exit_code != 0 and "entry's own 'columns'" in got.output
