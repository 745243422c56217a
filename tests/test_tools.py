"""Tool calling (goinfer/chat/): request checks, call formats detected from real chat
templates, calls and results rendered by those templates and parsed back, grammars checked
with llguidance on hand-written and randomly walked replies, and the streaming parser against
the whole-reply parser.

The references are independent of the code under test: the real chat templates of Qwen 2.5,
Llama 3.1 and Mistral Nemo (written by the model makers) render calls that our parser must
read back, jsonschema validates arguments, and expected parses are written by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import llguidance as llg
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goinfer import chat as T
from goinfer.chat_template import GEMMA_TEMPLATE, render_chat_template
from goinfer.constrained import MAX_SAFE_INT, bound_numbers, token_view
from goinfer.errors import GoinferError, ToolError
from goinfer.tokenizer import TOKEN_TYPE, Tokenizer

DATA = Path(__file__).parent / "data"
TEMPLATES = {p.stem: p.read_text() for p in (DATA / "chat_templates").glob("*.jinja")}
QWEN = TEMPLATES["Qwen-Qwen2.5-7B-Instruct"]
LLAMA = TEMPLATES["meta-llama-Llama-3.1-8B-Instruct"]
MISTRAL = TEMPLATES["mistralai-Mistral-Nemo-Instruct-2407"]
SMOLLM2 = TEMPLATES["HuggingFaceTB-SmolLM2-135M-Instruct"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/num"}},
            "required": ["a", "b"],
            "additionalProperties": False,
            "$defs": {"num": {"type": "number", "minimum": 0}},
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# ============================================================================ fixtures


@pytest.fixture(scope="module")
def tok():
    """SmolLM2's tokenizer (from its GGUF metadata), plus Llama 3's and Mistral's tool markers
    as control tokens, so grammars see both text and special-token markers."""
    with gzip.open(DATA / "smollm2_tokenizer_metadata.json.gz", "rt", encoding="utf-8") as f:
        md = json.load(f)
    extra = ["<|python_tag|>", "[TOOL_CALLS]", "<|eom_id|>"]
    md["tokenizer.ggml.tokens"] = md["tokenizer.ggml.tokens"] + extra
    md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"] + [TOKEN_TYPE.CONTROL] * 3
    return Tokenizer.from_metadata(md)


@pytest.fixture(scope="module")
def lltok(tok):
    return token_view(tok).ll  # goinfer's llguidance view of the tokenizer


def spec(choice="auto", parallel=True, tools=TOOLS):
    return T.check_tools(tools, choice, parallel)


NAMED_ADD = {"type": "function", "function": {"name": "add"}}


def allowed(mode, *names, form="chat"):
    """OpenAI's tool_choice allowing the named tools (form "responses": {"type", "name"})."""
    tools = [
        {"type": "function", "function": {"name": n}}
        if form == "chat"
        else {"type": "function", "name": n}
        for n in names
    ]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


CHOICES = {
    "add": NAMED_ADD,
    "allowed-add-auto": allowed("auto", "add"),
    "allowed-add-required": allowed("required", "add"),
}

# ============================================================================ checks


BAD = [
    ({"type": "function"}, None, None, "tools"),
    (["get_weather"], None, None, "tools[0]"),
    ([{"type": "retrieval"}], None, None, "tools[0].type"),
    ([{"type": "function"}], None, None, "tools[0].function"),
    (
        [{"type": "function", "function": {"name": "get weather"}}],
        None,
        None,
        "tools[0].function.name",
    ),
    ([WEATHER, WEATHER], None, None, "tools[1].function.name"),
    (
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
        None,
        None,
        "tools[0].function.parameters",
    ),
    (
        [{"type": "function", "function": {"name": "f", "parameters": [1]}}],
        None,
        None,
        "tools[0].function.parameters",
    ),
    (
        [
            WEATHER,
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "objekt"}}},
                },
            },
        ],
        None,
        None,
        "tools[1].function.parameters",
    ),
    (
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"not": {"type": "string"}}},
                    },
                },
            }
        ],
        None,
        None,
        "tools[0].function.parameters",
    ),  # a feature the engine cannot enforce
    (
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "pattern": "[a-"}},
                    },
                },
            }
        ],
        None,
        None,
        "tools[0].function.parameters",
    ),
    (
        [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"$ref": "#/$defs/missing"}},
                    },
                },
            }
        ],
        None,
        None,
        "tools[0].function.parameters",
    ),
    (
        [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": "yes"}}],
        None,
        None,
        "tools[0].function.strict",
    ),
    (TOOLS, "sometimes", None, "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice"),
    (TOOLS, {"type": "function"}, None, "tool_choice"),
    (TOOLS, 3, None, "tool_choice"),
    (None, "required", None, "tool_choice"),
    (None, NAMED_ADD, None, "tool_choice"),
    (TOOLS, "auto", "yes", "parallel_tool_calls"),
    (TOOLS, allowed("sometimes", "add"), None, "tool_choice.allowed_tools.mode"),
    (TOOLS, allowed("auto"), None, "tool_choice.allowed_tools.tools"),
    (TOOLS, allowed("auto", "add", "nope"), None, "tool_choice.allowed_tools.tools[1]"),
    (
        TOOLS,
        {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "auto",
                "tools": [{"type": "custom", "custom": {"name": "add"}}],
            },
        },
        None,
        "tool_choice.allowed_tools.tools[0]",
    ),
    (
        TOOLS,
        {
            "type": "allowed_tools",
            "allowed_tools": {"mode": "auto", "tools": [NAMED_ADD], "extra": 1},
        },
        None,
        "tool_choice.allowed_tools",
    ),
    (TOOLS, {"type": "allowed_tools"}, None, "tool_choice"),
    (None, allowed("required", "add"), None, "tool_choice.allowed_tools.tools[0]"),
]


@pytest.mark.parametrize("tools,choice,parallel,param", BAD)
def test_bad_tool_input_raises_with_param(tools, choice, parallel, param):
    with pytest.raises(ToolError) as e:
        T.check_tools(tools, choice, parallel)
    assert e.value.param == param
    assert isinstance(e.value, GoinferError) and isinstance(e.value, ValueError)
    assert str(e.value)


def test_checked_tools():
    assert T.check_tools(None) is None and T.check_tools([], "none") is None
    assert T.check_tools(None, "auto") is None
    s = T.check_tools([{"type": "function", "function": {"name": "now"}}] + TOOLS)
    assert [t.name for t in s.tools] == ["now", "get_weather", "add"]
    assert s.tools[0].parameters == {"type": "object", "properties": {}}
    assert (s.choice, s.parallel, s.many, s.forced) == ("auto", True, True, False)
    n = spec(NAMED_ADD)
    assert [t.name for t in n.callable] == ["add"] and n.forced and not n.many
    assert spec("none").callable == () and not spec("required", False).many
    assert s.tools[1].as_openai() == WEATHER
    for form in ("chat", "responses"):
        a = spec(allowed("required", "add", form=form))
        assert [t.name for t in a.tools] == ["get_weather", "add"]  # all of them in the prompt
        assert [t.name for t in a.callable] == ["add"] and a.forced and a.many
    a = spec(allowed("auto", "add", "get_weather"), parallel=False)
    assert [t.name for t in a.callable] == ["get_weather", "add"] and not a.forced


# ============================================================================ formats


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
        ("Qwen-Qwen3-0.6B", "hermes"),
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
        ("HuggingFaceTB-SmolLM2-135M-Instruct", "generic"),
        ("HuggingFaceTB-SmolLM3-3B", "generic"),
        ("google-gemma-2-2b-it", "generic"),
    ],
)
def test_format_from_real_templates(name, fmt):
    assert T.format_of(TEMPLATES[name]).name == fmt


def test_format_of_other_templates():
    assert T.format_of(GEMMA_TEMPLATE) is T.GENERIC
    assert T.format_of("") is T.GENERIC
    # renders tools, but in no format we parse: the generic format (our prompt, our parser)
    odd = "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert T.format_of(odd) is T.GENERIC
    assert T.format_of("{% broken") is T.GENERIC
    xml = (
        "{{ tools | tojson }}<tool_call>\n<function=name>\n<parameter=x>\n"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert T.format_of(xml) is T.QWEN_XML  # Qwen3-Coder's XML calls


# ============================================================================ rendering


def conversation(calls):
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris, and 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *[
            {"role": "tool", "tool_call_id": c["id"], "content": f"result-{i}"}
            for i, c in enumerate(calls)
        ],
    ]


def call(name, args, cid):
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


CALLS = [
    call("get_weather", {"city": "Paris", "unit": "celsius"}, "abcdefgh1"),
    call("add", {"a": 2, "b": 3.5}, "abcdefgh2"),
]
ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<end_of_turn>")


def rendered_reply(template, fmt, messages, s):
    """The assistant's tool-call turn exactly as the template writes it: the prompt with the
    turn, minus the prompt before it, cut at the end-of-turn token."""
    upto = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    kw = dict(bos_token="<s>", eos_token="</s>")
    m0, t0 = T.chat_inputs(messages[:upto], fmt, s)
    m1, t1 = T.chat_inputs(messages[: upto + 1], fmt, s)
    before = render_chat_template(template, m0, add_generation_prompt=True, tools=t0, **kw)
    full = render_chat_template(template, m1, add_generation_prompt=False, tools=t1, **kw)
    assert full.startswith(before)
    reply = full[len(before) :]
    cut = min((reply.find(e) for e in ENDS if e in reply), default=len(reply))
    return reply[:cut]


@pytest.mark.parametrize(
    "template,fmt,calls",
    [
        (QWEN, "hermes", CALLS),
        (QWEN, "hermes", CALLS[:1]),
        (MISTRAL, "mistral", CALLS),
        (LLAMA, "llama3", CALLS[:1]),  # Llama 3.1's template takes one call per turn
        (SMOLLM2, "generic", CALLS),
        (GEMMA_TEMPLATE, "generic", CALLS[1:]),
    ],
)
def test_template_renders_calls_our_parser_reads_back(template, fmt, calls):
    f = T.format_of(template)
    assert f.name == fmt
    s = spec()
    messages = conversation(calls)
    # (Mistral's template shows the system message only when a user message comes last)
    reply = rendered_reply(template, f, messages[1:], s)
    content, got = T.parse_reply(reply, f, s)
    assert not content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]
    if fmt == "mistral":  # the ids the template wrote are read back
        assert [c["id"] for c in got] == [c["id"] for c in calls]
    # the whole conversation renders: tools listed, results after the calls
    m, t = T.chat_inputs(messages, f, s)
    prompt = render_chat_template(template, m, tools=t, bos_token="<s>", eos_token="</s>")
    assert "Current weather in a city" in prompt
    assert ("You are terse." in prompt) == (fmt != "mistral")
    for i in range(len(calls)):
        assert prompt.index(f"result-{i}") > prompt.index(reply.strip()[:20])


def test_generic_rendering():
    s = spec()
    m, tools = T.chat_inputs(conversation(CALLS), T.GENERIC, s)
    assert tools is None  # the template never sees tools: our prompt carries them
    assert m[0]["role"] == "system" and m[0]["content"].startswith("You are terse.\n\n# Tools")
    assert json.dumps(WEATHER) in m[0]["content"] and json.dumps(ADD) in m[0]["content"]
    assert m[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "add", '
        '"arguments": {"a": 2, "b": 3.5}}\n</tool_call>',
    }
    # consecutive results: one user turn
    assert m[3] == {
        "role": "user",
        "content": "<tool_response>\nresult-0\n</tool_response>\n"
        "<tool_response>\nresult-1\n</tool_response>",
    }
    assert len(m) == 4
    # no system message: the tool prompt is one; no tools: history still in our format
    m2, _ = T.chat_inputs(conversation(CALLS)[1:], T.GENERIC, s)
    assert m2[0]["role"] == "system" and m2[0]["content"].startswith("# Tools")
    m3, _ = T.chat_inputs(conversation(CALLS), T.GENERIC, None)
    assert (
        m3[0] == {"role": "system", "content": "You are terse."}
        and "<tool_call>" in m3[2]["content"]
    )


# ============================================================================ grammars


def accepts(lltok, tok, grammar, text) -> bool:
    m = llg.LLMatcher(lltok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(tok.encode(text, parse_special=True)) and m.is_accepting()


W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
A = '{"name": "add", "arguments": {"a": 1, "b": 2.5}}'
HW, HA = f"<tool_call>\n{W}\n</tool_call>", f"<tool_call>\n{A}\n</tool_call>"
LW, LA = W.replace("arguments", "parameters"), A.replace("arguments", "parameters")
REPLIES = {  # format -> named replies
    "generic": {
        "text": "Hello there",
        "empty": "",
        "w": HW,
        "a": HA,
        "text+w": "Sure. " + HW,
        "w+a": HW + "\n" + HA,
        "a-bad-arg": HA.replace("2.5", '"x"'),
        "a-neg": HA.replace("2.5", "-1"),
        "w-bad-name": HW.replace("weather", "wether"),
        "w+text": HW + " bye",
        "a-extra": HA.replace("2.5", '2.5, "c": 1'),
        "w-spaced": HW.replace('": ', '":  '),
    },
    "llama3": {
        "text": "Hello there",
        "empty": "",
        "w": LW,
        "a": LA,
        "tag+w": "<|python_tag|>" + LW,
        "w+a": LW + "; " + LA,
        "a-bad-arg": LA.replace("2.5", '"x"'),
        "w-args-key": W,
        "text+tag": "Hi <|python_tag|>" + LW,
        "tag": "<|python_tag|>",
    },
    "mistral": {
        "text": "Hello there",
        "empty": "",
        "w": f"[TOOL_CALLS][{W}]",
        "a": f"[TOOL_CALLS][{A}]",
        "w+a": f"[TOOL_CALLS][{W}, {A}]",
        "a-id": f'[TOOL_CALLS][{A[:-1]}, "id": "abcdefgh1"}}]',
        "text+w": f"Sure. [TOOL_CALLS][{W}]",
        "bare": f"[{W}]",
        "a-bad-arg": f"[TOOL_CALLS][{A}]".replace("2.5", "null"),
    },
}
EXPECT = {  # (format, choice, parallel) -> replies accepted
    ("generic", "auto", True): {"text", "empty", "w", "a", "text+w", "w+a"},
    ("generic", "auto", False): {"text", "empty", "w", "a", "text+w"},
    ("generic", "required", True): {"w", "a", "w+a"},
    ("generic", "required", False): {"w", "a"},
    ("generic", "add", True): {"a"},
    ("generic", "none", True): {"text", "empty"},
    ("llama3", "auto", True): {"text", "empty", "w", "a", "tag+w", "w+a"},
    ("llama3", "auto", False): {"text", "empty", "w", "a", "tag+w"},
    ("llama3", "required", True): {"w", "a", "w+a"},
    ("llama3", "required", False): {"w", "a"},
    ("llama3", "add", False): {"a"},
    # "none": the special tag is never allowed; a reply opening with "{" is just text
    ("llama3", "none", True): {"text", "empty", "w", "a", "w+a", "a-bad-arg", "w-args-key"},
    ("mistral", "auto", True): {"text", "empty", "w", "a", "w+a", "a-id", "text+w", "bare"},
    ("mistral", "auto", False): {"text", "empty", "w", "a", "a-id", "text+w", "bare"},
    ("mistral", "required", True): {"w", "a", "w+a", "a-id"},
    ("mistral", "required", False): {"w", "a", "a-id"},
    ("mistral", "add", True): {"a", "a-id"},
    ("mistral", "none", False): {"text", "empty", "bare"},
    # allowed_tools: calls of the allowed tools only, "required" from the first token
    ("generic", "allowed-add-auto", True): {"text", "empty", "a"},
    ("generic", "allowed-add-required", True): {"a"},
    ("llama3", "allowed-add-auto", True): {"text", "empty", "a"},
    ("llama3", "allowed-add-required", False): {"a"},
    ("mistral", "allowed-add-auto", True): {"text", "empty", "a", "a-id", "bare"},
    ("mistral", "allowed-add-required", True): {"a", "a-id"},
}


@pytest.mark.parametrize("key", list(EXPECT), ids=lambda k: "-".join(map(str, k)))
def test_grammar_accepts_exactly_the_valid_replies(key, tok, lltok):
    fmt_name, choice, parallel = key
    fmt = {"generic": T.GENERIC, "llama3": T.LLAMA3, "mistral": T.MISTRAL}[fmt_name]
    g = T.tool_grammar(spec(CHOICES.get(choice, choice), parallel), fmt, tok)
    got = {k for k, text in REPLIES[fmt_name].items() if accepts(lltok, tok, g, text)}
    assert got == EXPECT[key]


def test_hermes_grammar_is_generic_grammar(tok, lltok):
    for choice in ("auto", "required", "none"):
        assert T.tool_grammar(spec(choice), T.HERMES, tok) == T.tool_grammar(
            spec(choice), T.GENERIC, tok
        )
    assert T.tool_grammar(None, T.HERMES, tok) is None


def test_special_markers_are_tokens(tok, lltok):
    g = T.tool_grammar(spec("required"), T.MISTRAL, tok)
    tc = tok.token_to_id("[TOOL_CALLS]")
    assert f"<[{tc}]>" in g
    # spelling the marker out in text is not the marker
    ids = tok.encode("[TOOL_CALLS]", parse_special=False)
    assert len(ids) > 1
    m = llg.LLMatcher(lltok, g, log_level=0)
    assert not m.consume_tokens(ids)
    # without a tokenizer (or a vocabulary without it) the marker is text
    assert '"[TOOL_CALLS]"' in T.tool_grammar(spec("required"), T.MISTRAL)


def walk(lltok, tok, grammar, rng, prefix="", max_steps=300):
    """A random reply under the grammar: random allowed tokens, mostly one-character ones and
    often ones that close strings and objects, ending when a stop token is allowed and drawn."""
    m = llg.LLMatcher(lltok, grammar, log_level=0)
    out = tok.encode(prefix, parse_special=True)
    assert m.consume_tokens(out), m.get_error()
    stops = np.array(sorted(tok.stop_ids))
    short = np.array(
        [len(tok.token_bytes(i)) == 1 and not tok.is_control(i) for i in range(tok.vocab_size)]
    )
    closers = np.zeros(tok.vocab_size, dtype=bool)  # characters that end strings and objects
    closers[[tok.encode(c)[0] for c in '"}],'] + [tok.encode(c)[0] for c in "01a"]] = True
    for _ in range(max_steps):
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")
        ok = bits[: tok.vocab_size].astype(bool)
        if ok[stops].any() and (rng.random() < 0.3 or not ok.sum() > ok[stops].sum()):
            return tok.decode(out), True
        ok[stops] = False
        r = rng.random()
        pool = np.flatnonzero(ok & (closers if r < 0.3 else short if r < 0.8 else ok))
        t = int(rng.choice(pool if len(pool) else np.flatnonzero(ok)))
        assert m.consume_token(t), m.get_error()
        out.append(t)
    return tok.decode(out), False


OPENERS = {
    "generic": "Let me see. <tool_call>",
    "llama3": "<|python_tag|>",
    "mistral": "Let me see. [TOOL_CALLS]",
}


@pytest.mark.parametrize("fmt", [T.GENERIC, T.LLAMA3, T.MISTRAL], ids=lambda f: f.name)
@pytest.mark.parametrize("choice", ["required", "add", "auto", "auto-opened"])
def test_random_replies_under_the_grammar_parse_and_validate(fmt, choice, tok, lltok):
    """Whatever a model writes under the grammar is read as calls whose arguments validate
    against their tools' schemas: forced choices always make a call, and so does "auto" once
    the opening marker is written ("auto-opened": the walk starts with text and the marker)."""
    s = spec(NAMED_ADD if choice == "add" else choice.split("-")[0])
    g = T.tool_grammar(s, fmt, tok)
    rng = np.random.default_rng(list(f"{fmt.name}{choice}".encode()))
    opened = choice == "auto-opened"
    finished = 0
    for _ in range(12):
        text, done = walk(lltok, tok, g, rng, OPENERS[fmt.name] if opened else "")
        if not done:
            continue
        finished += 1
        content, calls = T.parse_reply(text, fmt, s)
        if s.forced or opened:
            assert calls, text
            assert content == (None if s.forced or fmt.name == "llama3" else "Let me see.")
        else:
            assert content == text and not calls  # random text never opened a call
        for c in calls or []:
            if choice == "add":
                assert c["function"]["name"] == "add"
            args = json.loads(c["function"]["arguments"])
            jsonschema.validate(args, SCHEMAS[c["function"]["name"]])
    assert finished >= 6


# ============================================================================ parsing


def parsed(text, fmt=T.GENERIC, s=None):
    content, calls = T.parse_reply(text, fmt, s or spec())
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls or []]


WA = ("get_weather", '{"city": "Paris"}')
AA = ("add", '{"a": 1, "b": 2.5}')
PARSES = [  # (format, reply, content, calls)
    (T.GENERIC, "Hello there", "Hello there", []),
    (T.GENERIC, "  Hello\n", "  Hello\n", []),  # no calls: the text as it is
    (T.GENERIC, HW, None, [WA]),
    (T.GENERIC, "Let me check.\n" + HW + "\n" + HA + "\n", "Let me check.", [WA, AA]),
    (T.GENERIC, HW + "\nDone.", "Done.", [WA]),
    (T.GENERIC, "a " + HW + " b", "a b", [WA]),
    (T.GENERIC, f"<tool_call>{W}</tool_call>", None, [WA]),
    (T.GENERIC, f"<tool_call>\n{W}", None, [WA]),  # stopped before the close marker
    (T.GENERIC, f"<tool_call>\n{W}\n</tool", None, [WA]),
    (T.GENERIC, f"<tool_call>[{W}, {A}]</tool_call>", None, [WA, AA]),  # a list in one block
    (T.HERMES, f"<tool_call>\n{W}\n</tool_call>", None, [WA]),
    (T.LLAMA3, LW, None, [WA]),
    (T.LLAMA3, " \n" + LW, None, [WA]),
    (T.LLAMA3, "<|python_tag|>" + LW + "; " + LA, None, [WA, AA]),
    (T.LLAMA3, W, None, [WA]),  # "arguments" instead of "parameters"
    (T.LLAMA3, "Sure: " + LW, "Sure: " + LW, []),  # JSON not at the start is text
    (T.LLAMA3, "It is <|python_tag|>" + LW, "It is", [WA]),
    (T.MISTRAL, f"[TOOL_CALLS][{W}, {A}]", None, [WA, AA]),
    (T.MISTRAL, f"[TOOL_CALLS] [ {W} ]", None, [WA]),
    (T.MISTRAL, f"[TOOL_CALLS]{W}", None, [WA]),
    (T.MISTRAL, f"Sure. [TOOL_CALLS][{W}] ok", "Sure. ok", [WA]),
]
MALFORMED = [  # unparseable call text stays in the content, as it was
    (T.GENERIC, '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'),
    (T.GENERIC, '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>'),
    (T.GENERIC, '<tool_call>\n{"name": "add", "arguments": "{}"}\n</tool_call>'),
    (T.GENERIC, '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'),
    (T.GENERIC, '<tool_call>\n{"name": "add"}\n</tool_call>'),
    (T.GENERIC, '<tool_call>\n{"name": "add", "arguments": {"a": 1'),  # cut short
    (T.GENERIC, "<tool_call>get_weather(city='Paris')</tool_call>"),
    (T.GENERIC, "<tool_call>\n" + W + " trailing</tool_call>"),
    (T.GENERIC, "<tool_call>"),
    (T.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}'),
    (T.LLAMA3, '{"answer": 42}'),
    (T.MISTRAL, "[TOOL_CALLS][" + W),
    (T.MISTRAL, "[TOOL_CALLS]not json"),
]


@pytest.mark.parametrize("fmt,text,content,calls", PARSES)
def test_parse_reply(fmt, text, content, calls):
    assert parsed(text, fmt) == (content, calls)


@pytest.mark.parametrize("fmt,text", MALFORMED)
def test_malformed_calls_stay_content(fmt, text):
    assert parsed(text, fmt) == (text, [])


def test_bad_block_then_good_block():
    text = "x <tool_call>oops</tool_call> then " + HW
    assert parsed(text) == ("x <tool_call>oops</tool_call> then", [WA])


def test_tool_choice_none_and_no_tools_parse_nothing():
    assert parsed(HW, T.GENERIC, spec("none")) == (HW, [])
    assert T.parse_reply(HW, T.GENERIC, None) == (HW, None)


def test_named_function_reads_only_that_function():
    assert parsed(HW + HA, T.GENERIC, spec(NAMED_ADD)) == (HW, [AA])


def test_call_ids():
    _, calls = T.parse_reply(HW + HA, T.GENERIC, spec())
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    _, calls = T.parse_reply(f"[TOOL_CALLS][{W}, {A}]", T.MISTRAL, spec())
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)  # Mistral's template


# ============================================================================ streaming


def assemble(items):
    """Content and calls from streamed items, assembled as OpenAI clients do (by index)."""
    content, calls = "", {}
    for x in items:
        if isinstance(x, str):
            content += x
            continue
        d = x.as_openai()
        c = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
        if "id" in d:
            assert c["id"] is None and d["type"] == "function" and d["function"]["name"]
            c["id"], c["name"] = d["id"], d["function"]["name"]
        else:
            assert c["id"] is not None, "arguments before the call's id and name"
            assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
        c["arguments"] += d["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return content, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]


def stream(text, cuts, fmt=T.GENERIC, s=None):
    p = T.CallParser(fmt, s or spec())
    items, i = [], 0
    for j in sorted(set(cuts)) + [len(text)]:
        items += p.push(text[i:j])
        i = j
    items += p.finish()
    content, calls = assemble(items)
    assert content == (p.content or "")
    assert [
        (c["function"]["name"], c["function"]["arguments"]) for c in p.tool_calls or []
    ] == calls
    return (content if content or not calls else None), calls


@pytest.mark.parametrize("fmt,text,content,calls", PARSES)
def test_streamed_calls_assemble_to_the_parse(fmt, text, content, calls):
    for step in (1, 2, 3, 7, len(text) or 1):
        assert stream(text, range(0, len(text), step), fmt) == (content, calls)


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(PARSES), data=st.data())
def test_streaming_any_split(case, data):
    fmt, text, content, calls = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert stream(text, cuts, fmt) == (content, calls)


def test_streamed_name_before_arguments():
    p = T.CallParser(T.GENERIC, spec())
    assert p.push('<tool_call>\n{"name": "get_wea') == []
    first = p.push('ther", "arguments": {"ci')
    assert [d.as_openai() for d in first] == [
        {
            "index": 0,
            "id": p.calls[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"ci'},
        }
    ]
    assert [d.as_openai() for d in p.push('ty": "Paris"}}\n</tool_call>')] == [
        {"index": 0, "function": {"arguments": 'ty": "Paris"}'}}
    ]
    assert p.finish() == [] and p.content is None


def test_stream_holds_back_a_possible_marker():
    p = T.CallParser(T.GENERIC, spec())
    assert p.push("Hi <tool_") == ["Hi"]
    assert p.push("box> x") == [" <tool_box> x"]
    p = T.CallParser(T.LLAMA3, spec())
    assert p.push("  ") == []  # the reply may still open with a JSON call
    assert p.push("Hello") == ["  Hello"]


def test_stream_cut_short_keeps_the_call_begun():
    """max_tokens inside the arguments: the call stays as far as it went (finish_reason
    "length" tells the client), as OpenAI streams do."""
    p = T.CallParser(T.GENERIC, spec())
    out = p.push('<tool_call>\n{"name": "add", "arguments": {"a": 1')
    out += p.finish()
    assert assemble(out) == ("", [("add", '{"a": 1')])


# ============================================================================ ChatSession.chat

# Bounded arguments (enums, small integers, booleans): a random tiny model under the grammar
# finishes its call within a few dozen tokens.
BOUNDED = [
    {
        "type": "function",
        "function": {
            "name": "set_mode",
            "parameters": {
                "type": "object",
                "properties": {
                    "mode": {"enum": ["fast", "exact"]},
                    "level": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["mode", "level"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "toggle",
            "parameters": {
                "type": "object",
                "properties": {"on": {"type": "boolean"}},
                "required": ["on"],
                "additionalProperties": False,
            },
        },
    },
]
BOUNDED_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in BOUNDED}
ASK = [{"role": "user", "content": "Switch to exact mode."}]


@pytest.fixture(scope="module")
def tiny_model(tiny):
    from goinfer.gguf import GGUFFile
    from goinfer.model import Model

    _, path = tiny("llama", 5, max_position_embeddings=4096)
    return Model(GGUFFile(path), threads=1, progress=False)


def _check_calls(r, only=None):
    assert r.finish_reason == "tool_calls", (r.finish_reason, r.text)
    assert r.tool_calls and r.content is None
    for c in r.tool_calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        assert only is None or c["function"]["name"] == only
        jsonschema.validate(
            json.loads(c["function"]["arguments"]), BOUNDED_SCHEMAS[c["function"]["name"]]
        )
    assert r.message() == {"role": "assistant", "content": None, "tool_calls": r.tool_calls}


@pytest.mark.parametrize("seed", range(3))
def test_chat_forced_calls_from_a_random_model_validate(tiny_model, seed):
    """A random model has no idea of the format: the grammar alone makes its replies calls."""
    s = tiny_model.session()
    # one call each: a random model may chain parallel calls until max_tokens
    kw = dict(max_tokens=120, temperature=1.0, seed=seed, parallel_tool_calls=False)
    r = s.chat(ASK, tools=BOUNDED, tool_choice="required", **kw)
    _check_calls(r)
    assert len(r.tool_calls) == 1
    r = s.chat(
        ASK,
        tools=BOUNDED,
        tool_choice={"type": "function", "function": {"name": "toggle"}},
        **dict(kw, parallel_tool_calls=True),
    )
    _check_calls(r, only="toggle")
    assert len(r.tool_calls) == 1  # a named function is called once


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_chat_allowed_tools(tiny_model, mode):
    """tool_choice allowed_tools: the prompt keeps every tool (the same prompt as "auto", so
    the cached prefix holds across steps), calls are held to the allowed ones ("required":
    from the first token; the grammar tests above hold "auto" once a call is opened)."""
    from goinfer.chat import prepare_chat

    choice = allowed(mode, "toggle")
    assert (
        prepare_chat(tiny_model, ASK, BOUNDED, choice).prompt
        == prepare_chat(tiny_model, ASK, BOUNDED, "auto").prompt
    )
    s = tiny_model.session()
    for seed in range(3):
        r = s.chat(
            ASK,
            tools=BOUNDED,
            tool_choice=choice,
            max_tokens=120,
            temperature=1.0,
            seed=seed,
            parallel_tool_calls=False,
        )
        if mode == "required":
            _check_calls(r, only="toggle")
        else:
            assert all(c["function"]["name"] == "toggle" for c in r.tool_calls or [])


def test_chat_stream_gives_the_same_calls(tiny_model):
    s = tiny_model.session()
    kw = dict(
        tools=BOUNDED,
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        seed=4,
        parallel_tool_calls=False,
    )
    whole = s.chat(ASK, **kw)
    items = list(s.chat(ASK, stream=True, **kw))
    result = items.pop()
    content, calls = assemble(items)
    assert content == "" and result.tool_calls == [
        dict(c, id=result.tool_calls[i]["id"]) for i, c in enumerate(whole.tool_calls)
    ]
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls]
    assert result.tokens == whole.tokens and result.finish_reason == "tool_calls"


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_chat_stream_with_logprobs_carries_them_on_every_item(tiny_model, choice):
    """ChatSession.chat(stream=True, logprobs=True, tools=...): content pieces and tool call
    deltas carry the entries of their tokens; together they are the result's list."""
    from goinfer.generation import Piece

    s = tiny_model.session()
    kw = dict(
        tools=BOUNDED,
        tool_choice=choice,
        max_tokens=120,
        temperature=1.0,
        seed=4,
        parallel_tool_calls=False,
        logprobs=True,
        top_logprobs=1,
    )
    items = list(s.chat(ASK, stream=True, **kw))
    result = items.pop()
    got = [e for x in items for e in (x.logprobs or [])]
    assert got == result.logprobs["content"] and len(got) == len(result.tokens)
    assert all(isinstance(x, Piece) for x in items if isinstance(x, str))
    deltas = [x for x in items if isinstance(x, T.ToolCallDelta)]
    if choice == "required":
        assert deltas and any(d.logprobs for d in deltas)
    whole = s.chat(ASK, **kw)  # not streamed: the same tokens (its prompt comes from the
    assert whole.tokens == result.tokens  # cache, hence logprobs equal to ~1e-7, not bits)
    assert np.allclose(
        [e["logprob"] for e in whole.logprobs["content"]],
        [e["logprob"] for e in got],
        atol=1e-5,
        rtol=0,
    )


def test_chat_tool_choice_none_and_auto(tiny_model):
    s = tiny_model.session()
    r = s.chat(ASK, tools=BOUNDED, tool_choice="none", max_tokens=40, temperature=1.0, seed=1)
    assert r.tool_calls is None and r.content == r.text and "<tool_call>" not in r.text
    assert r.finish_reason in ("stop", "length")
    r = s.chat(ASK, tools=BOUNDED, max_tokens=40, temperature=1.0, seed=1)  # auto
    content, calls = T.parse_reply(r.text, T.GENERIC, T.check_tools(BOUNDED))
    assert r.content == content and (r.tool_calls is None) == (calls is None)


def test_chat_bad_tools_raise_before_generating(tiny_model):
    s = tiny_model.session()
    s.chat(ASK, max_tokens=2)
    held = s.tokens
    with pytest.raises(ToolError) as e:
        s.chat(ASK, tools=BOUNDED, tool_choice={"type": "function", "function": {"name": "x"}})
    assert e.value.param == "tool_choice" and s.tokens == held
    with pytest.raises(ToolError):  # one reply cannot follow a grammar and the call format
        s.chat(ASK, tools=BOUNDED, grammar='start: "yes"')
    assert s.tokens == held


def test_chat_tools_with_a_json_format_answer_or_call(tiny_model):
    """tool_choice "auto" with a JSON response_format (an agent's structured final answer):
    the reply is either the answer the schema holds or calls; a forced call ignores the
    format (the reply is calls)."""
    rf = {
        "type": "json_schema",
        "json_schema": {
            "name": "a",
            "schema": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            },
        },
    }
    for seed in range(6):  # which one a random model picks is its business
        r = tiny_model.session().chat(
            ASK,
            tools=BOUNDED,
            response_format=rf,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            parallel_tool_calls=False,
        )
        if r.tool_calls:
            assert r.finish_reason == "tool_calls" and not r.content
        else:
            assert json.loads(r.content) in ({"ok": True}, {"ok": False})
    r = tiny_model.session().chat(
        ASK,
        tools=BOUNDED,
        response_format=rf,
        max_tokens=200,
        tool_choice="required",
        temperature=1.0,
        seed=0,
        parallel_tool_calls=False,
    )
    assert r.tool_calls and r.finish_reason == "tool_calls"


def test_chat_tool_history_reuses_the_cache(tiny_model):
    """Turn 2 resends turn 1 with its call and the result: only the new part is prefilled."""
    s = tiny_model.session()
    kw = dict(
        tools=BOUNDED,
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        seed=2,
        parallel_tool_calls=False,
    )
    r1 = s.chat(ASK, **kw)
    messages = (
        ASK
        + [r1.message()]
        + [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in r1.tool_calls]
    )
    r2 = s.chat(messages, tools=BOUNDED, tool_choice="none", max_tokens=4)
    assert r2.cached_tokens >= r1.prompt_tokens - s.cache.block_size


def test_tools_benchmark_smoke():
    """benchmarks/tools.py runs end to end on a tiny model (speed is not asserted)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "tools.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tokens"] == 16 and out["format"] == "generic" and out["plain_tok_s"] > 0


def test_tool_defaults_benchmark_smoke():
    """benchmarks/tool_defaults.py (how replies end under OpenAI's defaults, through the openai
    client and a live server) runs end to end on a tiny model, on the installed package."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "tool_defaults.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (out,) = json.loads(r.stdout.strip().splitlines()[-1]).values()
    for choice in ("required", "auto"):  # 3 questions x (greedy + 1 seed)
        assert sum(out[choice]["replies"].values()) == 6
        assert sum(out[choice]["calls_per_reply"].values()) == 6


# ============================================================================ the end after calls
# Scripted logits (no forward pass): the "model" writes one call token by token, then would go
# on with prose, which the grammar forbids after a call.  Folding the forbidden tokens into the
# end (Constraint.fold_end) ends the reply with that one call; without it the sampler is pushed
# into another call, and another, until max_tokens.

TOGGLE = [BOUNDED[1]]
ONE_CALL = '<tool_call>\n{"name": "toggle", "arguments": {"on": true}}\n</tool_call>'


def _scripted(model, script, after):
    """logits(step) (vocab,) f32: +12 on the script's next token, then `after` (id -> logit)."""

    def logits(step):
        z = np.zeros(model.vocab_size, dtype=np.float32)
        if step < len(script):
            z[script[step]] = 12.0
        else:
            for t, v in after.items():
                z[t] = v
        return z

    return logits


def _drive(model, tc, logits, temperature=0.0, seed=None, max_tokens=160, grammar=None):
    """One generation of the tools' grammar fed `logits(step)` -> (finished result, logits fed)."""
    from types import SimpleNamespace

    from goinfer.generation import Generation
    from goinfer.sampling import SamplingParams

    g = tc.compiled() if grammar is None else grammar
    gen = Generation(
        model,
        [1, 2, 3],
        max_tokens,
        SamplingParams(temperature, seed=seed),
        [],
        grammar=g,
        logprobs=(True, 2),
    )
    fed = []
    while not gen.done:
        fed.append(logits(gen.n_steps))
        gen.push(fed[-1])
    gen.finish()
    r = SimpleNamespace(
        text=gen.text,
        tokens=gen.tokens,
        finish_reason=gen.finish_reason,
        logprobs=gen.logprobs,
        content=None,
        tool_calls=None,
    )
    return tc.finish(r), fed


def _after_call(tok, prose=20.0):
    """After the call: prose ("D") most likely, then a line break, then the opening "<"."""
    return {tok.encode("D")[0]: prose, tok.encode("\n")[0]: 5.0, tok.encode("<")[0]: 4.0}


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 0), (1.0, 1)])
def test_prose_after_a_call_ends_the_reply(tiny_model, temperature, seed):
    tok = tiny_model.tokenizer
    script = tok.encode(ONE_CALL, parse_special=True)
    logits = _scripted(tiny_model, script, _after_call(tok))
    tc = T.prepare_chat(tiny_model, ASK, TOGGLE, "required")  # parallel calls allowed
    r, _ = _drive(tiny_model, tc, logits, temperature, seed)
    assert r.finish_reason == "tool_calls" and r.text == ONE_CALL
    assert [c["function"]["arguments"] for c in r.tool_calls] == ['{"on": true}']
    # the same with tool_choice "auto" (the grammar is lazy until the marker)
    tc = T.prepare_chat(tiny_model, ASK, TOGGLE, "auto")
    r, _ = _drive(tiny_model, tc, logits, temperature, seed)
    assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1
    # without the fold the grammar pushes the prose into more calls, until max_tokens
    import dataclasses

    plain = dataclasses.replace(tc.compiled(), end_takes_forbidden=False)
    r, _ = _drive(tiny_model, tc, logits, temperature, seed, grammar=plain)
    assert r.finish_reason == "length" and r.text.count("<tool_call>") > 1


def test_a_line_break_after_a_call_still_allows_the_next(tiny_model):
    """Where the model wants another call more than anything else, it makes it: the fold only
    moves the probability of what the grammar forbids."""
    tok = tiny_model.tokenizer
    two = ONE_CALL + "\n" + ONE_CALL.replace("true", "false")
    script = tok.encode(two, parse_special=True)
    logits = _scripted(tiny_model, script, _after_call(tok))
    r, _ = _drive(tiny_model, T.prepare_chat(tiny_model, ASK, TOGGLE, "required"), logits)
    assert r.finish_reason == "tool_calls" and r.text == two
    assert [c["function"]["arguments"] for c in r.tool_calls] == ['{"on": true}', '{"on": false}']


def test_free_text_before_a_call_is_not_ended_by_the_fold(tiny_model):
    """tool_choice "auto": before the call marker the grammar forbids little (bytes that would
    not be valid UTF-8 here, control tokens); prose must not end because the model puts its
    mass there.  Once a call has been made, the end takes it (the test above)."""
    tok = tiny_model.tokenizer
    tc = T.prepare_chat(tiny_model, ASK, TOGGLE, "auto")
    c = tc.compiled().start(tiny_model.vocab_size)
    mask, stops = c.mask(), set(tok.stop_ids)
    c.close()
    assert c.accepting
    banned = [t for t in np.flatnonzero(~mask) if t not in stops]
    assert banned
    after = {int(t): 10.0 for t in banned} | {tok.encode("H")[0]: 5.0}
    r, _ = _drive(tiny_model, tc, _scripted(tiny_model, [], after), max_tokens=8)
    assert r.text == "H" * 8 and r.finish_reason == "length" and r.tool_calls is None
    # with a call marker in the reply, the same logits end it after the call
    script = tok.encode("Hi " + ONE_CALL, parse_special=True)
    r, _ = _drive(tiny_model, tc, _scripted(tiny_model, script, after))
    assert r.finish_reason == "tool_calls" and r.text == "Hi " + ONE_CALL


def _log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def test_folded_end_logprobs_are_of_the_raw_logits_and_seeded_runs_repeat(tiny_model):
    """A line break sampled where the end was folded: its logprob is the log-softmax of the
    logits the model gave (NumPy reference), not of the folded ones; a seed repeats the run."""
    tok = tiny_model.tokenizer
    nl = tok.encode("\n")[0]
    script = tok.encode(ONE_CALL, parse_special=True)
    after = {**_after_call(tok, prose=8.0), nl: 9.0}  # the line break wins the fold
    tc = T.prepare_chat(tiny_model, ASK, TOGGLE, "required")
    r, fed = _drive(tiny_model, tc, _scripted(tiny_model, script, after), max_tokens=90)
    assert r.tokens[len(script)] == nl  # sampled at the folded step
    for i, t in enumerate(r.tokens):
        ref = _log_softmax(fed[i])
        assert abs(r.logprobs[i]["logprob"] - ref[t]) < 1e-9
        top = np.argsort(-ref, kind="stable")[:2]
        assert [e["logprob"] for e in r.logprobs[i]["top_logprobs"]] == pytest.approx(
            ref[top], abs=1e-9
        )
    runs = [
        _drive(tiny_model, tc, _scripted(tiny_model, script, _after_call(tok, 3.0)), 1.0, seed)[0]
        for seed in (5, 5, 6)
    ]
    assert runs[0].tokens == runs[1].tokens and runs[0].logprobs == runs[1].logprobs


def test_fold_end_arithmetic(tiny_model):
    """Where the grammar may end: the best stop token carries log(sum exp) of the stop tokens
    and of every forbidden token; the other stops are masked; allowed tokens keep their
    logits.  Elsewhere, and for grammars without the flag, nothing changes."""
    tok = tiny_model.tokenizer
    tc = T.prepare_chat(tiny_model, ASK, TOGGLE, "required")
    c = tc.compiled().start(tiny_model.vocab_size)
    rng = np.random.default_rng(0)
    z = rng.normal(size=tiny_model.vocab_size).astype(np.float32)
    mask = c.mask()
    assert not c.accepting and c.fold_end(z, mask)[0] is z  # before the call: no end to fold
    for t in tok.encode(ONE_CALL, parse_special=True):
        assert c.advance(t) == "more"
        c.prefetch()
        mask = c.mask()
    assert c.accepting
    stops = sorted(t for t in tok.stop_ids if t < tiny_model.vocab_size)
    zf, mf = c.fold_end(z, mask)
    best = max(stops, key=lambda t: z[t])
    gone = [t for t in range(len(z)) if not mask[t] or t in stops]
    zz = np.asarray(z, dtype=np.float64)
    assert zf[best] == pytest.approx(np.log(np.exp(zz[gone]).sum()), rel=1e-12)
    assert mf[best] and not any(mf[t] for t in stops if t != best)
    keep = [t for t in range(len(z)) if mask[t] and t not in stops]
    assert keep and np.array_equal(zf[keep], zz[keep]) and np.array_equal(mf[keep], mask[keep])
    assert mask.sum() < len(z) - 100  # prose is forbidden here
    # tool_choice "none" and response formats: no fold
    none = T.prepare_chat(tiny_model, ASK, TOGGLE, "none").compiled()
    assert not none.end_takes_forbidden and tc.compiled().end_takes_forbidden


# ============================================================================ number bounds


def test_numbers_in_calls_are_bounded():
    p = {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "n": {"type": ["integer", "null"]},
            "own": {"type": "integer", "minimum": 0, "maximum": 9},
            "lo": {"type": "number", "exclusiveMinimum": 1.5, "multipleOf": 0.5},
            "xs": {"type": "array", "items": {"type": "number"}},
            "c": {"const": {"type": "number"}},
        },
    }
    b = bound_numbers(p)
    P, M = b["properties"], MAX_SAFE_INT
    assert P["x"] == {"type": "number", "minimum": -M, "maximum": M, "multipleOf": 1e-10}
    assert P["n"] == {"type": ["integer", "null"], "minimum": -M, "maximum": M}
    assert P["own"] == p["properties"]["own"]  # bounded already: unchanged
    assert P["lo"] == dict(p["properties"]["lo"], maximum=M)  # its own lower bound and step
    assert P["xs"]["items"]["maximum"] == M
    assert P["c"] == p["properties"]["c"]  # a value, not a schema
    assert p["properties"]["x"] == {"type": "number"}  # the tool's own schema is not touched
    own = {
        "type": "object",
        "properties": {"v": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.25}},
    }
    assert bound_numbers(own) == own


NUMBERS = [
    {
        "type": "function",
        "function": {
            "name": "put",
            "parameters": {
                "type": "object",
                "properties": {
                    "x": {"type": "number"},
                    "n": {"type": "integer"},
                    "k": {"type": "integer", "minimum": 3, "maximum": 7},
                },
                "required": ["x", "n", "k"],
                "additionalProperties": False,
            },
        },
    }
]


@pytest.mark.parametrize("temperature,seed", [(1.0, 0), (1.0, 1), (1.0, 2)])
def test_a_model_that_loves_digits_still_ends_its_call(tiny_model, temperature, seed):
    """Digits most likely everywhere: an unbounded number would take digit after digit until
    max_tokens; bounded, every number ends, within +-(2**53 - 1), at most 10 decimals, and a
    schema's own bounds hold."""
    tok = tiny_model.tokenizer
    digits = {tok.encode(d)[0]: 9.0 for d in "0123456789"}
    tc = T.prepare_chat(tiny_model, ASK, NUMBERS, "required", parallel_tool_calls=False)
    r, _ = _drive(
        tiny_model, tc, _scripted(tiny_model, [], digits), temperature, seed, max_tokens=200
    )
    assert r.finish_reason == "tool_calls", r.text
    (call,) = r.tool_calls
    raw = call["function"]["arguments"]
    args = json.loads(raw)
    jsonschema.validate(args, NUMBERS[0]["function"]["parameters"])
    assert abs(args["x"]) <= MAX_SAFE_INT and abs(args["n"]) <= MAX_SAFE_INT
    frac = raw.split('"x": ')[1].split(",")[0].partition(".")[2]
    assert len(frac) <= 10 and "e" not in raw.lower()
