"""Constrained decoding (goinfer/constrained.py), logprobs (goinfer/logprobs.py) and their hooks
in Session.generate / Generation.

Goldens are independent of the code under test: outputs are checked with `json` and
`jsonschema`, logprobs against a float64 log-softmax of Model.logits (teacher-forced), and
constrained greedy steps against an argmax over the raw logits restricted to the allowed set."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import schemas, tinygemma
from fixtures.compare import load
from goinfer import constrained
from goinfer.chat import GENERIC, check_tools, parse_reply, tool_grammar
from goinfer.constrained import Tag, compile_request, tags_grammar, token_view
from goinfer.errors import GoinferError, GrammarError, RequestError
from goinfer.generation import Generation
from goinfer.sampling import Sampler, SamplingParams
from goinfer.tokenizer import TOKEN_TYPE, Tokenizer

# ============================================================================ fixtures

RATE = schemas.Rate()
# GOINFER_CONSTRAINED_SCALE=k runs k times the Hypothesis examples (a longer validation sweep)
SCALE = max(1, int(os.environ.get("GOINFER_CONSTRAINED_SCALE", "1")))


@pytest.fixture(scope="module", autouse=True)
def report_rate(request):
    """Print the validation rate of the Hypothesis runs at the end of the module (uncaptured)."""
    yield
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    with capman.global_and_fixture_disabled():
        for line in RATE.lines():
            tr.write_line(line) if tr is not None else print(line)


@pytest.fixture(scope="module")
def llama(tiny):
    return load(tiny("llama", 7)[1], context_length=1536)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    hf = tinygemma.hf_model(0, num_hidden_layers=2)
    return load(
        tinygemma.write_gguf(hf, tmp_path_factory.mktemp("cgemma") / "g.gguf"), context_length=1536
    )


@pytest.fixture(scope="module")
def gemma3():
    from goinfer import Model, hub

    return Model.load(str(hub.resolve("gemma3-270m", progress=False)), progress=False)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
}


def rf(schema, name="x", strict=True):
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }


# ============================================================================ tokenizer view


@pytest.mark.parametrize("which", ["llama", "gemma", "smollm2"])
def test_token_view_matches_goinfer_tokenizer(which, llama, gemma, smollm2):
    """llguidance sees every token as the bytes goinfer decodes it to; control/unused tokens
    are special; EOS is the tokenizer's eos."""
    tok = {"llama": llama, "gemma": gemma, "smollm2": smollm2}[which].tokenizer
    v = token_view(tok)
    assert token_view(tok) is v  # built once per tokenizer
    assert v.vocab_size == tok.vocab_size and v.eos == tok.eos_id
    ids = range(tok.vocab_size) if tok.vocab_size < 1000 else range(0, tok.vocab_size, 7)
    n_special = 0
    for i in ids:
        special = tok.token_type(i) in (TOKEN_TYPE.CONTROL, TOKEN_TYPE.UNKNOWN, TOKEN_TYPE.UNUSED)
        # llguidance's special marker is a leading 0xFF byte, which UTF-8 text never has: a
        # byte token 0xFF reads as special too (and is never allowed, as in any UTF-8 output)
        ff = not special and tok.token_bytes(i).startswith(b"\xff")
        assert v.ll.is_special_token(i) == (special or ff), (i, tok.id_to_token(i))
        if special:
            n_special += 1
            assert v.special_id(tok.id_to_token(i)) == i
        elif not ff:
            assert v.ll.decode_bytes([i]) == tok.token_bytes(i), i
    assert n_special > 0


def test_encode_fragment(gemma, smollm2):
    for tok in (gemma.tokenizer, smollm2.tokenizer):
        for text in [" the cat", "Hello, world!", '{"a": 1}', "<|im_end|> x"]:
            ids = tok.encode_fragment(text)
            assert b"".join(tok.token_bytes(i) for i in ids).decode() == text
            assert not any(tok.is_control(i) for i in ids)  # special text stays text
    assert gemma.tokenizer.encode_fragment("") == []


# ============================================================================ compiling


BAD = [
    (
        dict(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "foo"}},
            }
        ),
        "response_format",
        "Invalid type",
    ),
    (
        dict(response_format=rf({"type": "array", "uniqueItems": True})),
        "response_format",
        "uniqueItems",
    ),
    (
        dict(response_format=rf({"type": "string", "pattern": "(?=a)b"})),
        "response_format",
        "look-around",
    ),
    (
        dict(response_format=rf({"type": "integer", "minimum": 5, "maximum": 3})),
        "response_format",
        "minimum",
    ),
    (dict(response_format=rf({"$ref": "#/$defs/nope"})), "response_format", "nope"),
    (
        dict(response_format=rf({"type": "object", "properties": 3})),
        "response_format",
        "properties",
    ),
    (dict(response_format=rf({"enum": {1, 2}})), "response_format", "not JSON"),
    (dict(response_format={"type": "json_schema"}), "response_format", "json_schema"),
    (
        dict(
            response_format={"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}
        ),
        "response_format",
        "strict",
    ),
    (dict(response_format={"type": "xml"}), "response_format", "type"),
    (dict(response_format={"type": "json_object", "schema": {}}), "response_format", "unknown"),
    (dict(response_format="json"), "response_format", "object"),
    (dict(grammar="start: foo"), "grammar", "unknown name"),
    (dict(grammar='start: <nosuch> "a"'), "grammar", "special token"),
    (dict(grammar='start: ("a"'), "grammar", ""),
    (dict(grammar={"regex": "(ab"}), "grammar", "regex"),
    (dict(grammar={"regex": 5}), "grammar", "string"),
    (dict(grammar={"glob": "*"}), "grammar", "regex"),
    (dict(grammar="   "), "grammar", "empty"),
    (dict(grammar='start: "a"', response_format={"type": "json_object"}), "grammar", "not both"),
]


@pytest.mark.parametrize("kw,param,words", BAD)
def test_bad_input_raises_typed_error_before_any_token(llama, kw, param, words):
    s = llama.session()
    before = s.generate([5, 6, 7], max_tokens=4)
    held = s.tokens
    with pytest.raises(GrammarError) as e:
        s.generate([5, 6, 7, 8], max_tokens=4, **kw)
    assert isinstance(e.value, (RequestError, GoinferError, ValueError))
    assert e.value.param == param
    assert words.lower() in str(e.value).lower()
    assert len(str(e.value)) < 800  # llguidance's long lists are cut
    # nothing was generated or lost: the session is as before and serves the next request
    assert s.tokens == held
    assert s.generate([5, 6, 7], max_tokens=4).tokens == before.tokens


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(logprobs="yes"), "logprobs"),
        (dict(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ],
)
def test_bad_logprobs_arguments(llama, kw, param):
    with pytest.raises(RequestError) as e:
        llama.session().generate([5, 6], max_tokens=2, **kw)
    assert e.value.param == param


def test_text_format_is_unconstrained(llama):
    a = llama.session().generate([5, 6, 7], max_tokens=12, temperature=0.9, seed=3)
    b = llama.session().generate(
        [5, 6, 7], max_tokens=12, temperature=0.9, seed=3, response_format={"type": "text"}
    )
    assert a.tokens == b.tokens and b.reason is None


def test_same_schema_compiles_once(llama):
    view = token_view(llama.tokenizer)
    schema = {"type": "object", "properties": {"q": {"type": "integer", "minimum": 17}}}
    n = view.n_compiled
    g1 = compile_request(llama.tokenizer, response_format=rf(schema))
    g2 = compile_request(
        llama.tokenizer, response_format=rf(json.loads(json.dumps(schema)), name="other")
    )
    assert g1 is g2 and view.n_compiled == n + 1
    assert compile_request(llama.tokenizer, response_format=g1) is g1  # a compiled one passes


# ============================================================================ masks and sampling


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 5]),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    min_p=st.sampled_from([0.0, 0.1]),
)
def test_all_allowed_mask_changes_nothing(seed, temperature, top_k, top_p, min_p):
    """An all-true mask leaves every sampler's choice (and its rng stream) as without one."""
    z = np.random.default_rng(seed).normal(0, 3, 97).astype(np.float32)
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    a, b = Sampler(p, 97), Sampler(p, 97)
    ones = np.ones(97, dtype=bool)
    assert [a.sample(z) for _ in range(5)] == [b.sample(z, ones) for _ in range(5)]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.0, 0.7, 1.5]),
    top_k=st.sampled_from([0, 3]),
    top_p=st.sampled_from([1.0, 0.5]),
)
def test_masked_tokens_are_never_drawn(seed, temperature, top_k, top_p):
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, 64).astype(np.float32)
    mask = rng.random(64) < 0.2
    mask[rng.integers(64)] = True
    s = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed), 64)
    got = [s.sample(z, mask) for _ in range(20)]
    assert all(mask[t] for t in got)
    if temperature == 0.0:
        allowed = np.flatnonzero(mask)
        assert got[0] == allowed[np.argmax(z[allowed])]


def test_constrained_greedy_is_masked_argmax(smollm2):
    """Each constrained greedy token is the argmax of the model's raw logits over the tokens
    the grammar allowed (masks replayed on a fresh matcher), and the grammar did override the
    unconstrained choice at some step."""
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = smollm2.session().chat(msgs, max_tokens=40, response_format=rf(PERSON))
    assert r.reason == "grammar complete"
    jsonschema.validate(json.loads(r.text), PERSON)
    ids = smollm2.tokenize_chat(smollm2.apply_chat_template(msgs))
    ref = smollm2.logits(ids + r.tokens)[len(ids) - 1 :]  # (n + 1, vocab)
    c = compile_request(smollm2.tokenizer, response_format=rf(PERSON)).start(smollm2.vocab_size)
    overridden = 0
    for i, t in enumerate(r.tokens):
        mask = c.mask()
        allowed = np.flatnonzero(mask)
        assert t == allowed[np.argmax(ref[i][allowed])]
        overridden += int(np.argmax(ref[i]) != t)
        c.advance(t)
        c.prefetch()
    assert overridden > 0


# ============================================================================ outputs validate


def _tiny_prompt(model):
    return model.tokenize("Hi there", add_special=True)[:8] or [5]


def _tiny_run(model, name, schema, seed, temperature, valid_for=None):
    """A random-weights model on a bounded schema, whitespace cut to one optional space (the
    schema's own x-guidance, passed through): every output ends well within max_tokens, so
    every output must be complete, parse and validate (against valid_for, if given)."""
    schema = dict(schema, **{"x-guidance": {"whitespace_pattern": r"\x20"}})
    r = model.session().generate(
        _tiny_prompt(model),
        max_tokens=1200,
        temperature=temperature,
        seed=seed,
        response_format=rf(schema),
    )
    RATE.check(name, r, schema if valid_for is None else valid_for)
    assert r.finish_reason == "stop"


@settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schema=schemas.schemas(bounded=True),
    seed=st.integers(0, 2**31 - 1),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_random_schemas_tiny_llama(llama, schema, seed, temperature):
    """Byte-level BPE vocabulary, random weights: whatever is chosen parses and validates."""
    _tiny_run(llama, "tiny-llama (BPE)", schema, seed, temperature)


@settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schema=schemas.schemas(bounded=True),
    seed=st.integers(0, 2**31 - 1),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_random_schemas_tiny_gemma(gemma, schema, seed, temperature):
    """SentencePiece vocabulary with byte fallback (digits, quotes, braces are byte tokens)."""
    _tiny_run(gemma, "tiny-gemma (SentencePiece)", schema, seed, temperature)


# ============================================================================ closed objects


@settings(max_examples=30 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schema=schemas.schemas(bounded=True, closed=False),
    seed=st.integers(0, 2**31 - 1),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_objects_that_declare_properties_are_closed(llama, schema, seed, temperature):
    """An object schema with properties and no additionalProperties admits no other key (as
    OpenAI and llama.cpp read it): a random-weights model's output, under the schema as a
    response_format and as a tool's parameters, is complete and validates against the schema
    with "additionalProperties": false added to every object (jsonschema)."""
    closed = schemas.with_closed_objects(schema)
    _tiny_run(
        llama,
        "tiny-llama (objects without additionalProperties)",
        schema,
        seed,
        temperature,
        valid_for=closed,
    )
    spec = check_tools(
        [{"type": "function", "function": {"name": "f", "parameters": schema}}], "required", False
    )
    r = llama.session().generate(
        _tiny_prompt(llama),
        max_tokens=1200,
        temperature=temperature,
        seed=seed,
        grammar=tool_grammar(spec, GENERIC, llama.tokenizer),
    )
    assert r.finish_reason == "stop" and r.reason == "grammar complete", r.text
    _, calls = parse_reply(r.text, GENERIC, spec)
    assert calls and len(calls) == 1, r.text
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), closed)


def test_closing_keeps_what_a_schema_says():
    """additionalProperties true or a schema keeps its meaning; allOf branches are merged (the
    object is closed over all their keys, the branches stay open, so their intersection is not
    empty); a required key the object does not declare stays allowed; an object without
    properties (json_object) stays open."""
    from goinfer.constrained import close_objects, schema_error

    open_ = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    typed = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    assert close_objects(open_) == open_ and close_objects(typed) == typed
    assert close_objects({"type": "object"}) == {"type": "object"}
    both = {
        "allOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    c = close_objects(both)
    assert c["additionalProperties"] is False and set(c["properties"]) == {"a", "b"}
    assert all("additionalProperties" not in b for b in c["allOf"])
    assert not schema_error(json.dumps(c))
    jsonschema.validate({"a": 1, "b": "x"}, c)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"a": 1, "b": "x", "c": 0}, c)
    sloppy = {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]}
    c = close_objects(sloppy)
    jsonschema.validate({"a": 1, "b": 2}, c)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"a": 1, "b": 2, "c": 3}, c)


def _real_chat(model, schema, seed, temperature):
    msgs = [{"role": "user", "content": "Answer with a JSON object: " + json.dumps(schema)[:300]}]
    return model.session().chat(
        msgs,
        max_tokens=REAL_MAX_TOKENS,
        temperature=temperature,
        seed=seed,
        response_format=rf(schema),
    )


# Real models on unbounded-number schemas: an output may run to max_tokens (a model writing
# digits), so each test also sets a floor on the outputs that completed (and so were parsed
# and validated): without it the check passes when nothing completes.  Measured with 160
# tokens: SmolLM2 8/8, Gemma 3 5/5 (with 48: 5/8 and 2/5).
REAL_MAX_TOKENS = 160


def _real_schemas(model, name: str, n: int, min_complete: int) -> None:
    before = list(RATE.runs.get(name, [0, 0, 0]))

    @settings(max_examples=n * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        schema=schemas.schemas(max_leaves=4),
        seed=st.integers(0, 2**31 - 1),
        temperature=st.sampled_from([0.0, 0.8]),
    )
    def run(schema, seed, temperature):
        RATE.check(name, _real_chat(model, schema, seed, temperature), schema)

    run()
    generated, complete, valid = (x - y for x, y in zip(RATE.runs[name], before))
    assert generated == n * SCALE and valid == complete >= min_complete * SCALE, RATE.runs[name]


def test_random_schemas_smollm2(smollm2):
    _real_schemas(smollm2, "SmolLM2-135M", 8, 7)


def test_random_schemas_gemma3(gemma3):
    _real_schemas(gemma3, "Gemma-3-270M", 5, 4)


def test_json_object_and_regex_and_lark(smollm2):
    s = smollm2.session()
    msgs = [{"role": "user", "content": "Give me a JSON object with a name."}]
    r = s.chat(msgs, max_tokens=80, response_format={"type": "json_object"})
    if r.finish_reason == "stop":
        assert isinstance(json.loads(r.text), dict)
    else:
        assert r.finish_reason == "length" and r.text.startswith("{")
    r = s.generate("The phone number is", max_tokens=20, grammar={"regex": r"[0-9]{3}-[0-9]{4}"})
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r.text) and r.reason == "grammar complete"
    r = s.generate(
        "Is the sky blue? Answer:", max_tokens=20, grammar='start: ANSWER "."\nANSWER: "yes" | "no"'
    )
    assert r.text in ("yes.", "no.") and r.finish_reason == "stop"


def test_max_tokens_inside_a_value_is_length(smollm2):
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string"}},
        "required": ["story"],
        "additionalProperties": False,
    }
    r = smollm2.session().chat(
        [{"role": "user", "content": "Tell a long story in JSON."}],
        max_tokens=12,
        response_format=rf(schema),
    )
    assert r.finish_reason == "length" and r.completion_tokens == 12 and r.reason is None
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


def test_numbers_in_a_schema_are_bounded(smollm2):
    """An integer with no bounds of its own ends after at most 16 digits (|n| <= 2**53 - 1):
    a small model writing "1111..." cannot run to max_tokens; its own bounds are kept."""
    tok = smollm2.tokenizer
    one = tok.encode_fragment("1")
    assert len(one) == 1  # SmolLM2's vocabulary has single-digit tokens only
    for schema, most in [({"type": "integer"}, 16), ({"type": "integer", "maximum": 10**6}, 6)]:
        c = compile_request(tok, response_format=rf(schema)).start(smollm2.vocab_size)
        n, state = 0, "more"
        while state == "more" and one[0] in _bits(c) and n < 40:
            state = c.advance(one[0])
            c.prefetch()
            n += 1
        assert n == most  # then no further digit: the grammar ended, or masks "1" out
        c.close()


def test_stop_token_ends_only_where_the_grammar_may_end(smollm2):
    """The model's end-of-turn is allowed exactly when the grammar accepts: a lazy free-text
    grammar lets the chat end normally; the reply is not cut mid-value."""
    lark = tags_grammar(smollm2.tokenizer, [Tag("<tool_call>", schema=PERSON)])
    r = smollm2.session().chat(
        [{"role": "user", "content": "Say hello."}], max_tokens=40, grammar=lark
    )
    plain = smollm2.session().chat([{"role": "user", "content": "Say hello."}], max_tokens=40)
    assert "<tool_call>" not in plain.text
    assert r.tokens == plain.tokens  # free text until a trigger: nothing constrained
    assert r.finish_reason == plain.finish_reason == "stop" and r.reason == "grammar complete"


# ============================================================================ dead ends


def _toy_model():
    """A SentencePiece vocabulary with no byte fallback and no 'c': `"a" "c"` cannot be
    completed once "a" is written."""
    toks = ["<unk>", "<s>", "</s>", "a", "b", "▁"]
    types = [2, 3, 3, 1, 1, 1]
    tok = Tokenizer(
        model="llama",
        tokens=toks,
        token_types=types,
        scores=[0, 0, 0, -1, -2, -3],
        bos_id=1,
        eos_id=2,
        unk_id=0,
        add_space_prefix=False,
    )
    return SimpleNamespace(tokenizer=tok, vocab_size=len(toks))


def test_dead_end_stops_with_a_reason():
    m = _toy_model()
    g = compile_request(m.tokenizer, grammar='start: "a" "c"')
    gen = Generation(m, [1], 8, SamplingParams(), [], grammar=g)
    logits = np.zeros(m.vocab_size, dtype=np.float32)
    logits[2] = 5.0  # the model would rather stop: not allowed, the grammar is not done
    gen.push(logits)
    assert gen.tokens == [3] and not gen.done
    gen.push(logits)
    gen.finish()
    res = gen.result(0, 1, 0.0, 0.0, 0.0)
    assert res.finish_reason == "stop" and res.reason.startswith("grammar dead end")
    assert res.text == "a"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_banning_every_allowed_token_stops(temperature):
    m = _toy_model()
    g = compile_request(m.tokenizer, grammar='start: "a" | "b"')
    p = SamplingParams(temperature=temperature, seed=1, logit_bias={3: -np.inf, 4: -np.inf})
    gen = Generation(m, [1], 8, p, [], grammar=g)
    gen.push(np.zeros(m.vocab_size, dtype=np.float32))
    assert gen.done and gen.tokens == [] and gen.finish_reason == "stop"
    assert "logit_bias" in gen.reason


def test_grammar_may_end_only_when_complete():
    m = _toy_model()
    g = compile_request(m.tokenizer, grammar='start: "ab" | "abab"')
    gen = Generation(m, [1], 8, SamplingParams(), [], grammar=g)
    logits = np.zeros(m.vocab_size, dtype=np.float32)
    logits[[2, 3, 4]] = [9.0, 1.0, 2.0]  # prefers </s>, then b, then a
    while not gen.done:
        gen.push(logits)
    gen.finish()
    res = gen.result(0, 1, 0.0, 0.0, 0.0)
    assert res.text == "ab" and res.finish_reason == "stop" and res.reason == "grammar complete"


# ============================================================================ lazy grammars


def _bits(c):
    return np.flatnonzero(c.mask())


def test_lazy_text_trigger(smollm2):
    tok = smollm2.tokenizer
    lark = tags_grammar(tok, [Tag("<tool_call>", schema=PERSON, begin="\n", end="\n</tool_call>")])
    c = compile_request(tok, grammar=lark).start(smollm2.vocab_size)
    for t in tok.encode_fragment("Let me look. "):
        assert len(_bits(c)) > 40000  # free text: (almost) anything
        assert c.advance(t) == "more"
        c.prefetch()
    for t in tok.encode_fragment("<tool_call>"):
        assert t in _bits(c)
        assert c.advance(t) == "more"
        c.prefetch()
    assert [tok.token_bytes(i) for i in _bits(c)] == [b"\n"]  # the grammar has engaged
    for t in tok.encode_fragment('\n{"name": "Al", "age": 3}\n</tool_call>'):
        assert t in _bits(c)
        c.advance(t)
        c.prefetch()
    assert c.mask()[tok.eos_id]  # free text again, may end


def test_special_token_trigger_and_required(smollm2):
    tok = smollm2.tokenizer
    im_start = tok.token_to_id("<|im_start|>")
    lark = tags_grammar(tok, [Tag("<|im_start|>", schema=PERSON)])
    assert f"<[{im_start}]>" in lark
    c = compile_request(tok, grammar=lark).start(smollm2.vocab_size)
    assert im_start in _bits(c)
    c.advance(tok.encode_fragment("Hi")[0])
    c.prefetch()
    c.advance(im_start)
    c.prefetch()
    assert {tok.token_bytes(i) for i in _bits(c)} <= {b"{", b'{"', b"{\n"}
    # required: a call from the first token, no free text
    req = tags_grammar(tok, [Tag("<tool_call>", schema=PERSON)], lazy=False, max_count=2)
    r = smollm2.session().chat(
        [{"role": "user", "content": "Who is Al?"}], max_tokens=60, grammar=req
    )
    assert r.text.startswith("<tool_call>")
    body = r.text[len("<tool_call>") :]
    if r.finish_reason == "stop":
        first = json.JSONDecoder().raw_decode(body)[0]
        jsonschema.validate(first, PERSON)


def test_tags_grammar_bad_arguments(smollm2):
    with pytest.raises(GrammarError):
        tags_grammar(smollm2.tokenizer, [])
    with pytest.raises(GrammarError):
        tags_grammar(smollm2.tokenizer, [Tag("")])
    with pytest.raises(GrammarError):
        tags_grammar(smollm2.tokenizer, [Tag("x")], lazy=False, min_count=2, max_count=1)


# ============================================================================ logprobs


def _check_logprobs(model, prompt_ids, r, top):
    ref = log_softmax(model.logits(prompt_ids + r.tokens))[len(prompt_ids) - 1 :]
    content = r.logprobs["content"]
    assert len(content) == len(r.tokens)
    tok = model.tokenizer
    for i, (t, e) in enumerate(zip(r.tokens, content)):
        assert abs(e["logprob"] - ref[i, t]) <= 1e-4
        assert bytes(e["bytes"]) == tok.token_bytes(t)
        assert len(e["top_logprobs"]) == top
        want = np.argsort(-ref[i], kind="stable")[:top]
        got = [x["logprob"] for x in e["top_logprobs"]]
        assert np.allclose(got, ref[i, want], atol=1e-4)
        assert got == sorted(got, reverse=True)
        for x, w in zip(e["top_logprobs"], want):
            if abs(ref[i, w] - x["logprob"]) < 1e-6:
                assert bytes(x["bytes"]) == tok.token_bytes(int(w))


def test_logprobs_equal_log_softmax_of_model_logits(smollm2):
    ids = smollm2.tokenize("The capital of France is", add_special=True)
    r = smollm2.session().generate(ids, max_tokens=10, logprobs=True, top_logprobs=5)
    _check_logprobs(smollm2, ids, r, 5)
    # before temperature, top-k and the grammar's mask: the same raw distribution
    r2 = smollm2.session().generate(
        ids,
        max_tokens=10,
        logprobs=True,
        top_logprobs=3,
        temperature=1.3,
        top_k=7,
        seed=11,
        grammar={"regex": "[ a-z]{2,40}"},
    )
    _check_logprobs(smollm2, ids, r2, 3)
    assert r2.reason is not None or r2.finish_reason == "length"


def test_logprobs_gemma_sentencepiece(gemma):
    ids = [2, 40, 41, 42]
    r = gemma.session().generate(
        ids, max_tokens=12, logprobs=True, top_logprobs=2, temperature=1.0, seed=4
    )
    _check_logprobs(gemma, ids, r, 2)


@pytest.mark.parametrize("stop", [None, ["e"]])
def test_streamed_logprobs_equal_non_streamed(smollm2, stop):
    ids = smollm2.tokenize("Once upon a time", add_special=True)
    kw = dict(max_tokens=16, logprobs=True, top_logprobs=2, stop=stop)
    r = smollm2.session().generate(ids, **kw)
    items = list(smollm2.session().generate(ids, stream=True, **kw))
    res, pieces = items[-1], items[:-1]
    assert res.logprobs == r.logprobs and res.text == r.text == "".join(pieces)
    streamed = [e for p in pieces for e in p.logprobs]
    assert streamed == r.logprobs["content"]
    if stop:
        assert r.finish_reason == "stop"
        # the tokens the stop string cut off are not reported
        assert "".join(e["token"] for e in streamed).startswith(r.text)


def test_no_logprobs_by_default(llama):
    r = llama.session().generate([5, 6], max_tokens=3)
    assert r.logprobs is None
    assert all(
        type(p) is str
        for p in list(llama.session().generate([5, 6], max_tokens=3, stream=True))[:-1]
    )


def test_mask_overlap_off_gives_the_same_tokens(llama, monkeypatch):
    schema = {
        "type": "object",
        "properties": {"v": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
    }
    a = llama.session().generate(
        [5, 6, 7], max_tokens=80, temperature=1.0, seed=9, response_format=rf(schema)
    )
    monkeypatch.setattr(constrained, "OVERLAP", False)
    b = llama.session().generate(
        [5, 6, 7], max_tokens=80, temperature=1.0, seed=9, response_format=rf(schema)
    )
    assert a.tokens == b.tokens and a.reason == b.reason


# ============================================================================ benchmark


def test_benchmark_smoke():
    """benchmarks/constrained.py runs end to end on a tiny model (speed is not asserted)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "constrained.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "schema-sync" in r.stdout and "mask alone" in r.stdout
