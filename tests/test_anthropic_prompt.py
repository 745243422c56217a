"""What Claude Code sends, rendered by the Messages API route: requests recorded from Claude Code
2.1.332 (tests/data/claude_code_requests.json.xz, tests/tools/pack_claude_code_requests.py),
parsed and tokenized as the server does (anthropic_request.parse_body, runner.prompt_ids) with
Gemma 3 270M's tokenizer and chat template.

Each request of a session must render as an extension of the one before (the prefix cache
keeps all of it), whatever moved in the JSON between them; each prompt normalisation is what
makes its case hold (turned off, the case breaks), and none drops anything the client sent."""

from __future__ import annotations

import json
import lzma
from collections import defaultdict
from pathlib import Path

import pytest

from goinfer import hub
from goinfer.chat.system import in_place, renders_system_in_place
from goinfer.chat_template import GEMMA_TEMPLATE
from goinfer.model import Model
from goinfer.server.anthropic_request import (
    BILLING_HEADER,
    Normalize,
    normalize_setting,
    parse_body,
    sign,
    unsign,
)
from goinfer.server.errors import APIError
from goinfer.server.runner import prompt_ids

DATA = Path(__file__).parent / "data"
REQUESTS = json.loads(lzma.decompress((DATA / "claude_code_requests.json.xz").read_bytes()))
SMOLLM2_TEMPLATE = DATA / "chat_templates" / "HuggingFaceTB-SmolLM2-135M-Instruct.jinja"


@pytest.fixture(scope="module")
def gemma():
    return Model.load(str(hub.resolve("gemma3-270m", progress=False)), threads=1, progress=False)


def render(tm, body, norm: Normalize | None = None):
    """(token ids, prompt text) of a Messages body, as the server renders it."""
    norm = Normalize() if norm is None else norm
    ids, tc = prompt_ids(tm, parse_body(body, tm.vocab_size, normalize=norm, defaults={}))
    return ids, tc.prompt


def requests(run: str) -> list[dict]:
    return [r for r in REQUESTS if r["run"] == run]


def sessions() -> dict[tuple, list[dict]]:
    """Request streams: (run, session id, agent id) -> requests in order."""
    out = defaultdict(list)
    for r in REQUESTS:
        h = r["headers"]
        key = (r["run"], h.get("x-claude-code-session-id"), h.get("x-claude-code-agent-id"))
        out[key].append(r)
    return out


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ============================================================================ a session's requests


def test_the_recordings_cover_what_changes_between_requests():
    """The recorded sessions hold every change the normalisations are for (a guard on the
    data: the tests below would pass vacuously without them)."""
    first = requests("cc_text")[0]["body"]
    assert first["system"][0]["text"].startswith(BILLING_HEADER)
    assert first["messages"][1]["role"] == "system" and isinstance(
        first["messages"][1]["content"], list
    )
    assert isinstance(requests("cc_text")[1]["body"]["messages"][1]["content"], str)
    names = [[t["name"] for t in r["body"]["tools"]] for r in requests("cc_sdk_ts")]
    assert names[0] != names[1] and "mcp__wx__get_weather" in names[1]
    assert any(
        m["role"] == "system" and "date has changed" in json.dumps(m["content"])
        for m in requests("cc_date")[-1]["body"]["messages"][2:]
    )
    marks = [json.dumps(r["body"]["messages"]).count("cache_control") for r in requests("cc_text")]
    assert all(marks)


@pytest.mark.parametrize("key", sorted(sessions(), key=str), ids=lambda k: f"{k[0]}-{k[2]}")
def test_each_request_extends_the_one_before(gemma, key):
    """Within a session (and within a subagent's own stream) the previous request's prompt
    is a prefix of the next one's, token for token."""
    stream = sessions()[key]
    prev = None
    for r in stream:
        ids, _ = render(gemma, r["body"])
        if prev is not None:
            assert ids[: len(prev)] == prev, (r["run"], r["n"], common(prev, ids), len(prev))
            assert len(ids) > len(prev)
        prev = ids


def test_sessions_share_everything_before_the_users_prompt(gemma):
    """Two sessions in one directory with other prompts: the billing header differs from the
    first block on, yet the prompts agree up to the user's own words."""
    a, b = (r["body"] for r in requests("cc_xsess"))
    assert a["system"][0] != b["system"][0]
    ia, ib = render(gemma, a)[0], render(gemma, b)[0]
    n = common(ia, ib)
    assert n > 0.8 * len(ia)
    head = gemma.tokenizer.decode(ia[:n])
    assert head.endswith("</system-reminder>\n"), head[-80:]


# ============================================================================ each normalisation


def test_billing_header(gemma):
    a, b = (r["body"] for r in requests("cc_xsess"))
    on_a, on_b = render(gemma, a), render(gemma, b)
    assert BILLING_HEADER not in on_a[1]
    off = Normalize(billing_header=False)
    off_a, off_b = render(gemma, a, off), render(gemma, b, off)
    assert BILLING_HEADER in off_a[1]
    assert common(off_a[0], off_b[0]) < 64 < common(on_a[0], on_b[0])
    # the header is the only difference
    head = "You are a Claude agent"
    assert off_a[1] == on_a[1].replace(head, a["system"][0]["text"] + head, 1)


def test_system_messages_in_place(gemma):
    """Claude Code's environment block is a system message after the first prompt, the last
    message of the first request.  Gemma's template holds a system message for the next user
    turn, so without the normalisation the first request would not show it at all."""
    body = requests("cc_text")[0]["body"]
    env = body["messages"][1]["content"][0]["text"]
    _, on = render(gemma, body)
    assert env.strip() in on and on.index("say hi") < on.index(env.strip())
    _, off = render(gemma, body, Normalize(system_in_place=False))
    assert env.strip()[:200] not in off
    # the date change, a system message after a later prompt, is in its own request too
    last = requests("cc_date")[-1]["body"]
    (date,) = [m for m in last["messages"][2:] if m["role"] == "system"]
    text = date["content"] if isinstance(date["content"], str) else date["content"][0]["text"]
    assert text.strip() in render(gemma, last)[1]


def test_deferred_tools(gemma):
    """ToolSearch loads a deferred MCP tool: Claude Code adds it to tools and moves
    DeferredToolPlaceholder to the end.  Deferred tools are left out of the tool list and the
    loaded one is shown in the tool result that loads it; off, the list is rendered as sent and
    the second request breaks the first one's prefix inside the tool list."""
    one, two = (r["body"] for r in requests("cc_sdk_ts")[:2])
    (i1, t1), (i2, t2) = render(gemma, one), render(gemma, two)
    assert i2[: len(i1)] == i1
    assert "DeferredToolPlaceholder" not in t2
    assert "Get the weather for a city" not in t1  # (its name is in the deferred list)
    load = t2.index(
        '<function>{"description": "Get the weather for a city", "name": "mcp__wx__get_weather"'
    )
    assert load > t2.index("select:mcp__wx__get_weather")  # where ToolSearch's result is
    req = parse_body(two, gemma.vocab_size, defaults={})
    assert "mcp__wx__get_weather" in {t["function"]["name"] for t in req.tools}  # callable now
    assert "DeferredToolPlaceholder" not in {t["function"]["name"] for t in req.tools}
    assert "mcp__wx__get_weather" not in {
        t["function"]["name"] for t in parse_body(one, gemma.vocab_size, defaults={}).tools
    }  # not before it is loaded
    off = Normalize(deferred_tools=False)
    o1, o2 = render(gemma, one, off)[0], render(gemma, two, off)[0]
    n = common(o1, o2)
    assert n < len(o1)
    assert '"name": "' in gemma.tokenizer.decode(o1[n - 40 : n + 5])  # inside the tool list


def test_block_lists_and_strings_render_alike(gemma):
    body = requests("cc_text")[0]["body"]
    as_string = json.loads(json.dumps(body))
    for m in as_string["messages"]:
        if isinstance(m["content"], list) and all(b["type"] == "text" for b in m["content"]):
            m["content"] = "".join(b["text"] for b in m["content"])
    as_string["system"] = [
        as_string["system"][0],
        {"type": "text", "text": "".join(b["text"] for b in as_string["system"][1:])},
    ]
    assert render(gemma, as_string)[0] == render(gemma, body)[0]


@pytest.mark.parametrize(
    "run", ["cc_text", "cc_tool", "cc_sdk_ts", "cc_think_sig", "cc_sub", "cc_websearch", "cc_inter"]
)
def test_nothing_the_client_sent_is_dropped(gemma, run):
    """Every text the request holds is in its prompt (the billing header and the deferred
    tools not yet loaded aside): system blocks, message and tool-result text, thinking, tool
    names, descriptions and schemas."""
    for r in requests(run):
        body = r["body"]
        _, prompt = render(gemma, body)
        texts = [b["text"] for b in body["system"] if not b["text"].startswith(BILLING_HEADER)]
        loaded = set()
        for m in body["messages"]:
            blocks = (
                [{"type": "text", "text": m["content"]}]
                if isinstance(m["content"], str)
                else m["content"]
            )
            for b in blocks:
                if b["type"] == "text":
                    texts.append(b["text"])
                elif b["type"] == "thinking":
                    pass  # Gemma 3's template shows no thinking: nothing to find
                elif b["type"] == "tool_use":
                    texts += [b["name"], json.dumps(b["input"], ensure_ascii=False)]
                elif b["type"] == "tool_result":
                    c = b["content"]
                    for x in [{"type": "text", "text": c}] if isinstance(c, str) else c:
                        if x["type"] == "text":
                            texts.append(x["text"])
                        else:
                            loaded.add(x["tool_name"])
        for t in body["tools"]:
            if not t.get("defer_loading") or t["name"] in loaded:
                texts += [t["name"], json.dumps(t["description"], ensure_ascii=False)[1:-1]]
                texts.append(json.dumps(t["input_schema"], ensure_ascii=False)[1:-1])
        for text in texts:
            assert text.strip() in prompt, (r["run"], r["n"], text[:100])


# ============================================================================ the pieces


def test_system_in_place_by_template():
    smol = SMOLLM2_TEMPLATE.read_text()
    assert renders_system_in_place(smol) and not renders_system_in_place(GEMMA_TEMPLATE)
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "system", "content": "E"},
        {"role": "assistant", "content": "A"},
        {"role": "system", "content": "D"},
        {"role": "user", "content": "U2"},
    ]
    assert in_place(msgs, smol) is msgs  # the template shows them where they are
    assert in_place(msgs, GEMMA_TEMPLATE) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1\n\nE"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "D"},
        {"role": "user", "content": "U2"},
    ]
    # the conversation up to the reply renders as a prefix of what comes after it
    from goinfer.chat_template import render_chat_template as rt

    a = rt(GEMMA_TEMPLATE, in_place(msgs[:4], GEMMA_TEMPLATE), add_generation_prompt=False)
    for n in range(5, len(msgs) + 1):
        b = rt(GEMMA_TEMPLATE, in_place(msgs[:n], GEMMA_TEMPLATE), add_generation_prompt=True)
        assert b.startswith(a) and "E" in a and "D" in b, (n, a, b)


def test_normalize_setting(monkeypatch):
    assert Normalize.parse("all") == Normalize() == Normalize.parse("")
    assert Normalize.parse("none") == Normalize(False, False, False)
    assert Normalize.parse("deferred_tools, billing_header") == Normalize(True, False, True)
    with pytest.raises(ValueError, match="billing_headers"):
        Normalize.parse("billing_headers")
    monkeypatch.setenv("GOINFER_ANTHROPIC_NORMALIZE", "system_in_place")
    assert normalize_setting() == Normalize(False, True, False)


def test_thinking_signatures():
    assert unsign(sign("Let me think: ü")) == "Let me think: ü"
    assert unsign("c2lnbmF0dXJl") is None and unsign(None) is None
    assert unsign("goinfer1:!!") is None


def test_tool_reference_to_an_unknown_tool(gemma):
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "ToolSearch",
                        "input": {"query": "select:Nope"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "tool_reference", "tool_name": "Nope"}],
                    }
                ],
            },
        ],
    }
    with pytest.raises(APIError) as e:
        parse_body(body, gemma.vocab_size, defaults={})
    assert e.value.status == 400 and "Nope" in e.value.message
    assert e.value.param == "messages[2].content[0].content[0]"
