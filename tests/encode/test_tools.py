"""Tool calls render exactly as the tokenizer's own ``apply_chat_template(messages, tools=...)`` renders them
(Qwen2.5-Instruct's template, the ``qwen2.5`` builtin), with loss on the assistant's calls, text and
end-of-turn token and none on tool results, for single and parallel calls and trees whose branches call
different tools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packer.core.types import IGNORE_INDEX, Encoded
from packer.encode.encoder import Encoder
from packer.errors import RecordError
from packer.formats import parse_record
from packer.models import get_profile
from tests.encode.helpers import builtin


def fn(name: str, **props: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": list(props)}}}


TOOLS = [fn("get_weather", city="string"), fn("get_time", zone="string"), fn("search", query="string")]


def call(name: str, **args) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def asst(text: str | None = None, *calls: dict) -> dict:
    m: dict = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = list(calls)
    return m


def tool(content: str, **kw) -> dict:
    return {"role": "tool", "content": content, **kw}


CORPUS = [
    {"tools": TOOLS, "messages": [user("Weather in Paris?"), asst(None, call("get_weather", city="Paris")),
                                  tool("18 C, sunny"), asst("It is 18 C and sunny in Paris.")]},
    {"tools": TOOLS, "messages": [user("Weather in Zürich?"),
                                  asst("Let me check.", call("get_weather", city="Zürich")),
                                  tool('{"temp": 9}', tool_call_id="c1", name="get_weather"), asst("9 C.")]},
    {"tools": TOOLS, "messages": [  # parallel calls, two results in one user turn
        {"role": "system", "content": "You are terse."}, user("Paris weather and Tokyo time?"),
        asst("", call("get_weather", city="Paris"), call("get_time", zone="Asia/Tokyo")),
        tool("18 C"), tool("21:04"), asst("18 C; 21:04.")]},
    {"tools": TOOLS, "messages": [  # arguments as a JSON string (OpenAI API style), multi-turn
        user("Search cats."),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "search", "arguments": '{"query": "cats"}'}}]},
        tool("cats are mammals"), asst("Cats are mammals."), user("And dogs?"),
        asst(None, call("search", query="dogs")), tool("dogs too"), asst("Dogs too.")]},
    {"messages": [user("Time?"), asst(None, call("get_time", zone="UTC")), tool("12:00"), asst("Noon.")]},  # no tools list
    {"tools": TOOLS, "messages": [user("Weather?"), asst(None, call("get_weather", city="Oslo")),
                                  {**tool("T=2"), "loss": True}, asst("2 C.")]},
    {"tools": TOOLS, "messages": [user("Paris: weather or time?")], "branches": [  # branches call different tools
        [asst(None, call("get_weather", city="Paris")), tool("18 C"), asst("18 C.")],
        [asst("Checking both.", call("get_time", zone="Europe/Paris"), call("get_weather", city="Paris")),
         tool("10:00"), tool("18 C"), asst("10:00, 18 C.")],
        [asst(None, call("search", query="Paris"))]]},
    {"tools": TOOLS, "messages": [user("Find news."), asst(None, call("search", query="news")), tool("N1; N2")],
     "branches": [[asst("N1 and N2.")],  # a branch point after a tool result
                  {"messages": [asst("Let me search more.", call("search", query="more news")), tool("N3")],
                   "branches": [[asst("N3.")], [asst(None, call("get_time", zone="UTC"))]]}]},
]


@pytest.fixture(scope="module")
def tok25():
    return builtin("qwen2.5")


@pytest.fixture(scope="module")
def enc25(tok25) -> Encoder:
    return Encoder(tok25, get_profile("text"))


def encode(encoder: Encoder, rec: dict, tmp_path: Path) -> Encoded:
    return encoder.encode(parse_record(rec, path="t.jsonl", line=1, base_dir=str(tmp_path)))


def paths(rec: dict) -> list[list[dict]]:
    """Every root-to-node message path of a record, depth-first (the Encoded node order)."""
    out: list[list[dict]] = []

    def walk(prefix: list[dict], branches: list | None) -> None:
        out.append(prefix)
        for b in branches or []:
            msgs, sub = (b, None) if isinstance(b, list) else (b["messages"], b.get("branches"))
            walk(prefix + msgs, sub)

    walk(rec["messages"], rec.get("branches"))
    return out


def template_ids(tok, messages: list[dict], tools) -> list[int]:
    ids = tok.apply_chat_template(messages, tools=tools, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def expected_loss_texts(messages: list[dict]) -> list[str]:
    """What each loss message trains on, written from Qwen2.5's format, not from packer: the content, each
    call as ``\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` (the first call's newline is
    the generation prompt's when there is no content) and ``<|im_end|>``; a tool result with ``loss: true``
    its content (the test checks it is among the loss tokens)."""
    out = []
    for m in messages:
        if m["role"] != "assistant" or m.get("loss") is False:
            continue
        content = m.get("content") or ""
        calls = "".join(
            '\n<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": '
            + json.dumps(c["function"]["arguments"], ensure_ascii=False) + "}\n</tool_call>"
            for c in m.get("tool_calls", [])
        )
        out.append(content + (calls if content else calls[1:]) + "<|im_end|>")
    return out


def path_arrays(e: Encoded, node: int) -> tuple[np.ndarray, np.ndarray]:
    ends = [*e.node_offsets[1:].tolist(), e.num_tokens]
    chain = [node]
    while e.node_parents[chain[-1]] >= 0:
        chain.append(int(e.node_parents[chain[-1]]))
    sl = [slice(int(e.node_offsets[n]), ends[n]) for n in reversed(chain)]
    return np.concatenate([e.input_ids[s] for s in sl]), np.concatenate([e.labels[s] for s in sl])


def loss_runs(tok, ids: np.ndarray, labels: np.ndarray) -> list[str]:
    runs, cur = [], []
    for i, lab in zip(ids.tolist(), labels.tolist(), strict=True):
        if lab != IGNORE_INDEX:
            assert lab == i
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


@pytest.mark.slow
@pytest.mark.parametrize("k", range(len(CORPUS)))
def test_tool_records_match_apply_chat_template(k, tok25, enc25, tmp_path):
    rec = CORPUS[k]
    e = encode(enc25, rec, tmp_path)
    for node, msgs in enumerate(paths(rec)):
        ids, labels = path_arrays(e, node)
        assert ids.tolist() == template_ids(tok25, msgs, rec.get("tools")), f"path {node}"
        # the loss runs are exactly the assistants' (so no tool result carries loss), plus flagged results
        runs = loss_runs(tok25, ids, labels)
        flagged = [m["content"] for m in msgs if m["role"] == "tool" and m.get("loss")]
        assert [r for r in runs if not any(r.startswith(f) for f in flagged)] == expected_loss_texts(msgs)
        for f in flagged:  # a tool result with "loss": true trains on its content
            assert any(r.startswith(f) for r in runs)
    assert e.input_ids[0] == tok25.convert_tokens_to_ids("<|im_start|>")
    assert (e.input_ids == tok25.convert_tokens_to_ids("<tool_call>")).any()  # the real Qwen2.5 token, one id


def test_a_template_without_tool_support_is_refused_not_silently_dropped(qwen, tmp_path):
    with pytest.raises(RecordError, match=r"template_error: the chat template does not render tool calls .*qwen2\.5"):
        encode(qwen, CORPUS[0], tmp_path)


@pytest.mark.parametrize(("msg", "match"), [
    ({"role": "user", "content": "x", "tool_calls": [call("f")]}, r"only assistant turns call tools"),
    ({"role": "assistant", "tool_calls": {"name": "f"}}, r"'tool_calls' must be a list"),
    ({"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}, r"tool_calls\[0\] must be"),
    ({"role": "tool", "content": "x", "tool_call_id": 3}, r"'tool_call_id' must be a string"),
    ({"role": "assistant"}, r"empty_messages: .* has no 'content'"),
])
def test_bad_tool_fields_are_rejected(msg, match, tmp_path):
    with pytest.raises(RecordError, match=match):
        parse_record({"messages": [user("hi"), msg]}, path="t.jsonl", line=1, base_dir=str(tmp_path))
    with pytest.raises(RecordError, match=r"wrong_type: 'tools' must be a list"):
        parse_record({"tools": "x", "messages": [user("hi")]}, path="t.jsonl", line=1, base_dir=str(tmp_path))
