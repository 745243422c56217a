"""Structured output and logprobs through the OpenAI-compatible server, driven by the official
openai client: response_format (json_object, json_schema, a Pydantic model through
``chat.completions.parse``), goinfer's ``grammar``, logprobs / top_logprobs in chat and legacy
completions, streamed and not; constrained requests batched with unconstrained ones give what
Session.generate gives alone; bad input is a 400 naming the field, and the server goes on."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field
from test_server import Server, extra, lone, msgs, sse_events

from fixtures.compare import load
from goinfer import KVCache
from goinfer.model import Model

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
}


def rf(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def smol(smollm2_path):
    # one kernel thread: faster on a loaded machine (the thread count changes no bit)
    return Model.load(str(smollm2_path), threads=1, progress=False)


@pytest.fixture(scope="module")
def srv(smol):
    with Server(smol, KVCache(smol, max_tokens=4096)) as s:
        yield s


@pytest.fixture(scope="module")
def tiny_model(tiny):
    return load(tiny("llama", 3)[1])


# ============================================================================ structured output


def test_json_object_and_schema(srv):
    c = srv.client()
    m = msgs("Describe a person (name and age) as JSON.")
    r = c.chat.completions.create(
        model="x", messages=m, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.chat.completions.create(
        model="x", messages=m, max_tokens=60, temperature=0, response_format=rf(PERSON)
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.model_dump()["choices"][0]["reason"] == "grammar complete"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    # sampled, streamed: the assembled text validates too
    chunks = list(
        c.chat.completions.create(
            model="x",
            messages=m,
            max_tokens=60,
            temperature=0.9,
            seed=4,
            stream=True,
            response_format=rf(PERSON),
        )
    )
    text = "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
    jsonschema.validate(json.loads(text), PERSON)
    assert chunks[-1].choices[0].finish_reason == "stop"


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: float = Field(ge=0, le=50)


def test_openai_parse_returns_a_pydantic_object(srv):
    r = srv.client().chat.completions.parse(
        model="x",
        messages=msgs("Describe Paris as JSON (name, country, population)."),
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_grammar_extension_on_completions(srv):
    r = srv.client().completions.create(
        model="x",
        prompt="The year is",
        max_tokens=10,
        temperature=0,
        extra_body={"grammar": {"regex": " [0-9]{4}"}},
    )
    assert r.choices[0].text[1:].isdigit() and len(r.choices[0].text) == 5


# ============================================================================ logprobs


def test_chat_logprobs_match_model_logits(srv, smol):
    m = msgs("Name a color.")
    r = srv.client().chat.completions.create(
        model="x",
        messages=m,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=4,
        extra_body={"return_tokens": True},
    )
    toks = r.model_dump()["tokens"]
    ids = smol.tokenize_chat(smol.apply_chat_template(m))
    ref = log_softmax(smol.logits(ids + toks))[len(ids) - 1 :]
    content = r.choices[0].logprobs.content
    assert len(content) == len(toks)
    for i, (t, e) in enumerate(zip(toks, content)):
        assert abs(e.logprob - ref[i, t]) <= 1e-4
        assert bytes(e.bytes) == smol.tokenizer.token_bytes(t)
        best = np.sort(ref[i])[::-1][:4]
        assert np.allclose([x.logprob for x in e.top_logprobs], best, atol=1e-4)


def test_streamed_logprobs_equal_non_streamed(srv):
    c = srv.client()
    m = msgs("Count to five.")
    kw = dict(model="x", messages=m, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    full = c.chat.completions.create(**kw).choices[0].logprobs.model_dump()["content"]
    chunks = list(c.chat.completions.create(stream=True, **kw))
    streamed = [
        e.model_dump()
        for x in chunks
        if x.choices and x.choices[0].logprobs
        for e in x.choices[0].logprobs.content
    ]
    assert streamed == full and len(full) > 0


def test_completions_legacy_logprobs(srv, smol):
    c = srv.client()
    kw = dict(
        model="x",
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        logprobs=3,
        extra_body={"return_tokens": True},
    )
    r = c.completions.create(**kw)
    lp = r.choices[0].logprobs
    toks = r.model_dump()["tokens"]
    ids = smol.tokenize("The capital of France is", add_special=True)
    ref = log_softmax(smol.logits(ids + toks))[len(ids) - 1 :]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(toks)
    assert np.allclose(lp.token_logprobs, [ref[i, t] for i, t in enumerate(toks)], atol=1e-4)
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == r.choices[0].text
    assert all(3 <= len(d) <= 4 for d in lp.top_logprobs)
    # streamed: the same numbers, the same offsets
    chunks = list(
        c.completions.create(stream=True, **{k: v for k, v in kw.items() if k != "extra_body"})
    )
    got = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for x in chunks:
        if x.choices and x.choices[0].logprobs:
            for k in got:
                got[k] += getattr(x.choices[0].logprobs, k)
    assert got == {k: getattr(lp, k) for k in got}


# ============================================================================ bad input


BAD = [
    ("/v1/chat/completions", {"response_format": rf({"type": "wat"})}, "response_format"),
    (
        "/v1/chat/completions",
        {"response_format": rf({"type": "array", "uniqueItems": True})},
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {"response_format": rf({"type": "string", "pattern": "(?<=a)b"})},
        "response_format",
    ),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
    (
        "/v1/chat/completions",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": "very"},
            }
        },
        "response_format",
    ),
    ("/v1/chat/completions", {"grammar": "start: ("}, "grammar"),
    ("/v1/chat/completions", {"grammar": {"regex": "(("}}, "grammar"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 99}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"grammar": 17}, "grammar"),
]


@pytest.mark.parametrize("path,body,param", BAD)
def test_bad_input_is_400_with_param_and_the_server_goes_on(srv, path, body, param):
    base = {"messages": msgs("hi")} if "chat" in path else {"prompt": "hi"}
    r = srv.post(path, dict(base, max_tokens=4, **body))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    n = srv.engine.n_finished
    ok = srv.post(path, dict(base, max_tokens=2))
    assert ok.status_code == 200 and srv.engine.n_finished == n + 1


def test_openai_client_sees_the_param(srv):
    with pytest.raises(openai.BadRequestError) as e:
        srv.client().chat.completions.create(
            model="x",
            messages=msgs("hi"),
            max_tokens=4,
            response_format=rf({"type": "integer", "minimum": 3, "maximum": 1}),
        )
    assert e.value.param == "response_format" and "minimum" in e.value.message


# ============================================================================ batching


def test_constrained_batched_with_unconstrained_equals_alone(tiny_model):
    """Constrained and unconstrained requests, greedy and sampled, streamed and not, admitted
    together: each result equals Session.generate / chat of the same request alone."""
    schemas = [
        PERSON,
        {
            "type": "object",
            "properties": {"v": {"type": "array", "maxItems": 4, "items": {"type": "integer"}}},
        },
        {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "w": {"enum": ["a", "bb", "ccc"]}},
        },
    ]
    jobs = []
    for i in range(8):
        body = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": i}
        if i % 4 != 3:
            body["response_format"] = rf(schemas[i % 3], name=f"s{i}")
        jobs.append((msgs(f"item {i}"), body, 24 + 5 * i, i % 3 == 1))
    with Server(tiny_model, max_batch=8, prefill_chunk=32) as s:

        def run(i):
            m, body, n, stream = jobs[i]
            if stream:
                ev = sse_events(
                    s.post(
                        "/v1/chat/completions", dict(body, messages=m, max_tokens=n, stream=True)
                    ).text
                )
                return "".join(
                    e["choices"][0]["delta"].get("content") or ""
                    for e in ev
                    if isinstance(e, dict) and e.get("choices")
                )
            else:
                return s.client().chat.completions.create(
                    model="x", messages=m, max_tokens=n, **extra(body)
                )

        results = s.together(run, len(jobs), timeout=120)
        assert s.engine.peak_batch >= 6  # constrained and unconstrained ran in one batch
        assert s.cache.stats().blocks_used == 0
    n_constrained = 0
    for (m, body, n, stream), r in zip(jobs, results):
        kw = {k: v for k, v in body.items() if k != "response_format"}
        ref = lone(
            tiny_model, chat=m, max_tokens=n, response_format=body.get("response_format"), **kw
        )
        if stream:
            assert r == ref.text
        else:
            assert r.model_dump()["tokens"] == ref.tokens
            assert r.choices[0].finish_reason == ref.finish_reason
        if "response_format" in body:
            n_constrained += 1
            if ref.finish_reason == "stop":
                schema = body["response_format"]["json_schema"]["schema"]
                jsonschema.validate(json.loads(ref.text), schema)
    assert n_constrained == 6


def test_preempted_constrained_requests_equal_alone(tiny_model):
    """A KV cache too small for all requests: constrained ones are preempted and recomputed
    like the others, with their grammar state intact, and equal the request alone."""
    cache = KVCache(tiny_model, max_tokens=160, block_size=16)  # 10 blocks
    prompts = [[(7 * i + k) % 250 for k in range(20 + i)] for i in range(4)]
    # long outputs (they fill the cache), each constrained in its own way
    grammars = [
        {"regex": "[a-z ]{40,60}\\."},
        "start: WORD{14,20}\nWORD: /[a-z]{2,4} /",
        {"regex": "[0-9]{3}(,[0-9]{3}){10,12}"},
        'start: "(" /[^()]{40,50}/ ")"',
    ]
    with Server(tiny_model, cache, max_batch=4) as s:

        def run(i):
            return s.client().completions.create(
                model="x",
                prompt=prompts[i],
                max_tokens=40,
                temperature=0.8,
                seed=i,
                extra_body={"return_tokens": True, "grammar": grammars[i]},
            )

        results = s.together(run, 4, timeout=60)
        assert s.engine.n_preempted > 0  # every request is constrained: one of them was
        assert cache.stats().blocks_used == 0
    for i, r in enumerate(results):
        ref = lone(
            tiny_model,
            prompt=prompts[i],
            max_tokens=40,
            temperature=0.8,
            seed=i,
            grammar=grammars[i],
        )
        assert r.model_dump()["tokens"] == ref.tokens


def test_drafting_constrained_batched_equals_alone_without_drafting(tiny_model):
    """Speculative drafting in the engine with response_format (json_schema) and logprobs:
    constrained and unconstrained requests, greedy and sampled, streamed and not, verify rows
    batched together; each equals the request alone WITHOUT drafting (tokens, finish reason,
    logprobs), and drafts are accepted in constrained requests too (non-vacuity)."""
    schema = {
        "type": "object",
        "required": ["a", "b"],
        "additionalProperties": False,
        "properties": {
            "a": {"type": "string", "maxLength": 20},
            "b": {"type": "array", "items": {"type": "integer"}, "maxItems": 8},
        },
    }
    copy = 'Copy this: {"a": "abab", "b": [1, 2, 1, 2]} ' * 4  # lookups find matches
    bias = {"97": 3.0, "98": 3.0, "49": 2.0, "44": 2.0}  # a, b, 1, ","
    jobs = []
    for i in range(6):
        body = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.9, "seed": i}
        body.update(logit_bias=bias, logprobs=True, top_logprobs=2)
        if i != 5:
            body["response_format"] = rf(schema, name=f"s{i}")
        jobs.append((msgs(copy + f"item {i}"), body, 50, i == 3))
    with Server(
        tiny_model, max_batch=8, prefill_chunk=64, draft="prompt_lookup", draft_tokens=6
    ) as s:

        def run(i):
            m, body, n, stream = jobs[i]
            req = dict(body, messages=m, max_tokens=n, return_tokens=True)
            if stream:
                ev = sse_events(s.post("/v1/chat/completions", dict(req, stream=True)).text)
                ch = [e["choices"][0] for e in ev if isinstance(e, dict) and e.get("choices")]
                return {
                    "text": "".join(c["delta"].get("content") or "" for c in ch),
                    "logprobs": [
                        x for c in ch if c.get("logprobs") for x in c["logprobs"]["content"]
                    ],
                }
            else:
                return s.post("/v1/chat/completions", req).json()

        results = s.together(run, len(jobs), timeout=120)
        assert s.engine.peak_batch >= 4
        assert s.cache.stats().blocks_used == 0
    accepted_constrained = 0
    for (m, body, n, stream), r in zip(jobs, results):
        kw = {k: v for k, v in body.items() if k not in ("response_format", "logit_bias")}
        ref = lone(
            tiny_model,
            chat=m,
            max_tokens=n,
            response_format=body.get("response_format"),
            logit_bias={int(k): v for k, v in bias.items()},
            **kw,
        )
        assert ref.timings.draft_tokens == 0
        if stream:
            assert r["text"] == ref.text
            assert r["logprobs"] == ref.logprobs["content"]
            continue
        assert r["tokens"] == ref.tokens
        assert r["choices"][0]["message"]["content"] == ref.text
        assert r["choices"][0]["finish_reason"] == ref.finish_reason
        assert r["choices"][0]["logprobs"]["content"] == ref.logprobs["content"]
        tm = r["timings"]
        assert 0 <= tm["draft_n_accepted"] <= tm["draft_n"]
        if "response_format" in body:
            accepted_constrained += tm["draft_n_accepted"]
    assert accepted_constrained > 0  # drafting really ran on constrained requests
