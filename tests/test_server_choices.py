"""Several choices in one request: OpenAI's n (chat and completions) and batched completion
prompts.  The prompt is computed once and the choices share its blocks (the session is
forked); choice i of a seeded request is what a lone request with seed + i gives (checked
against Session.generate / ChatSession.chat alone, bit for bit); usage counts each prompt
once."""

from __future__ import annotations

import json

import httpx
import pytest
from test_server import Server, lone, msgs, sse_events

from goinfer import KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model


@pytest.fixture(scope="module")
def model(tiny):
    return Model(GGUFFile(tiny("llama", 3)[1]), threads=1, progress=False)


@pytest.fixture(scope="module")
def srv(model):
    with Server(model) as s:
        yield s


def _chat(srv, **body):
    r = srv.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_choices_are_the_seeds_alone_and_the_prompt_is_computed_once(srv, model):
    ask = msgs("Tell me about the sea, at length.")
    before = srv.engine.prefill_tokens
    r = _chat(
        srv,
        messages=ask,
        n=4,
        max_tokens=12,
        temperature=1.0,
        seed=11,
        logprobs=True,
        return_tokens=True,
    )
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    refs = [
        lone(model, chat=ask, max_tokens=12, temperature=1.0, seed=11 + i, logprobs=True)
        for i in range(4)
    ]
    for c, ref in zip(r["choices"], refs):
        assert c["tokens"] == ref.tokens and c["message"]["content"] == ref.content
        assert [e["logprob"] for e in c["logprobs"]["content"]] == [
            e["logprob"] for e in ref.logprobs["content"]
        ]
    assert len({c["message"]["content"] for c in r["choices"]}) > 1
    u = r["usage"]
    assert u["prompt_tokens"] == refs[0].prompt_tokens  # the prompt once
    assert u["completion_tokens"] == sum(len(x.tokens) for x in refs)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # computed once: only one prompt's worth of prefill
    assert (
        srv.engine.prefill_tokens - before
        == u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]
    )
    assert r["timings"]["predicted_n"] == u["completion_tokens"]
    assert srv.cache.stats().blocks_used == 0  # every fork gave its blocks back


def test_n_without_a_seed_samples_each_choice_independently(srv):
    r = _chat(srv, messages=msgs("hello"), n=3, max_tokens=10, temperature=1.0)
    texts = [c["message"]["content"] for c in r["choices"]]
    assert len(set(texts)) == 3, texts


def test_n_streamed_equals_n_whole(srv):
    """Streamed, every chunk carries its choice's index: a role chunk per choice first, one
    finish chunk per choice, then the usage chunk (the prompt once) and [DONE]; each choice's
    text is the non-streamed one's."""
    body = dict(messages=msgs("Count to five."), n=3, max_tokens=10, temperature=0.9, seed=3)
    whole = _chat(srv, **body)
    r = srv.post(
        "/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True})
    )
    ev = [e for e in sse_events(r.text) if e != "ping"]
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
        {"role": "assistant", "content": ""}
    ] * 3
    assert [c["choices"][0]["index"] for c in chunks[:3]] == [0, 1, 2]
    texts, finishes = {}, {}
    for c in chunks[:-1]:
        ch = c["choices"][0]
        texts[ch["index"]] = texts.get(ch["index"], "") + (ch["delta"].get("content") or "")
        if ch["finish_reason"] is not None:
            assert ch["index"] not in finishes
            finishes[ch["index"]] = ch["finish_reason"]
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert finishes == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    u = chunks[-1]["usage"]  # (its prompt now comes from the cache)
    assert chunks[-1]["choices"] == [] and u["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert u["completion_tokens"] == whole["usage"]["completion_tokens"]


@pytest.fixture(scope="module")
def long_model(tiny):
    """A tiny model with room for the built-in tool prompt."""
    return Model(
        GGUFFile(tiny("llama", 5, max_position_embeddings=4096)[1]), threads=1, progress=False
    )


def test_n_with_tools_parses_each_choice(long_model):
    """A forced tool call in each of 3 choices: each choice's reply parsed on its own."""
    model = long_model
    tools = [
        {
            "type": "function",
            "function": {
                "name": "toggle",
                "parameters": {
                    "type": "object",
                    "properties": {"on": {"type": "boolean"}},
                    "required": ["on"],
                },
            },
        }
    ]
    with Server(model, KVCache(model, max_tokens=4096)) as srv:
        r = _chat(
            srv,
            messages=msgs("Switch it on."),
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            n=3,
            max_tokens=120,
            temperature=1.0,
            seed=5,
        )
    for i, c in enumerate(r["choices"]):
        ref = lone(
            model,
            chat=msgs("Switch it on."),
            tools=tools,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=120,
            temperature=1.0,
            seed=5 + i,
        )
        assert c["finish_reason"] == ref.finish_reason == "tool_calls"
        calls = c["message"]["tool_calls"]
        assert [(t["function"]["name"], t["function"]["arguments"]) for t in calls] == [
            (t["function"]["name"], t["function"]["arguments"]) for t in ref.tool_calls
        ]
        assert json.loads(calls[0]["function"]["arguments"]) in ({"on": True}, {"on": False})


def test_batched_completion_prompts(srv, model):
    """A list of prompts (strings and token ids) with n=2: choice p * n + i is prompt p's i-th
    (seed + i); usage counts each prompt once."""
    prompts = ["the cat sat on", [5, 6, 7, 8, 9]]
    body = dict(prompt=prompts, n=2, max_tokens=8, temperature=1.0, seed=21, return_tokens=True)
    r = srv.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    r = r.json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    refs = [
        lone(model, prompt=p, max_tokens=8, temperature=1.0, seed=21 + i)
        for p in prompts
        for i in range(2)
    ]
    for c, ref in zip(r["choices"], refs):
        assert c["tokens"] == ref.tokens and c["text"] == ref.text
    assert r["usage"]["prompt_tokens"] == refs[0].prompt_tokens + refs[2].prompt_tokens
    assert r["usage"]["completion_tokens"] == sum(len(x.tokens) for x in refs)
    # streamed: the same texts, each chunk with its index
    s = srv.post("/v1/completions", dict(body, stream=True))
    texts = {}
    for e in sse_events(s.text):
        if isinstance(e, dict):
            ch = e["choices"][0]
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    assert texts == {c["index"]: c["text"] for c in r["choices"]}
    # a batch of one is the one prompt
    one = srv.post("/v1/completions", dict(body, prompt=[prompts[1]], n=1)).json()
    assert one["tokens"] == refs[2].tokens  # (one choice: top-level, as before)


def test_n_over_the_batch_and_bad_batches_are_400(srv):
    for body, param in [
        ({"messages": msgs("x"), "n": 9}, "n"),
        ({"messages": msgs("x"), "n": 129}, "n"),
        ({"messages": msgs("x"), "n": 0}, "n"),
    ]:
        r = srv.post("/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    for prompt in (["a", ""], ["a", [1, 99999]], ["a", 5], ["x"] * 65):
        r = srv.post("/v1/completions", {"prompt": prompt})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_n_choices_preempted_still_equal_alone(model):
    """A cache too small for all choices at once: forks are preempted and recomputed (the
    prompt's blocks found in the cache again), and each choice still equals its seed alone."""
    cache = KVCache(model, max_tokens=160, block_size=16)  # 10 blocks
    prompt = [(5 * k) % 250 for k in range(30)]
    with Server(model, cache, max_batch=4) as s:
        r = s.post(
            "/v1/completions",
            dict(prompt=prompt, n=4, max_tokens=40, temperature=0.8, seed=2, return_tokens=True),
        ).json()
        assert s.engine.n_preempted > 0
        assert cache.stats().blocks_used == 0
    for i, c in enumerate(r["choices"]):
        ref = lone(model, prompt=prompt, max_tokens=40, temperature=0.8, seed=2 + i)
        assert c["tokens"] == ref.tokens


def test_client_gone_cancels_every_choice(srv):
    """Closing an n=4 stream early cancels the request's every choice: their blocks are
    freed."""
    body = dict(
        messages=msgs("go on"),
        n=4,
        max_tokens=400,
        temperature=1.0,
        stream=True,
        logit_bias={"261": -100, "263": -100},
    )  # no end of text / of turn
    seen = set()
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for n, line in enumerate(r.iter_lines()):
            if line.startswith("data: {"):
                seen.add(json.loads(line[6:])["choices"][0]["index"])
            if n > 40:
                break
    assert seen == {0, 1, 2, 3}
    assert srv.engine.n_active > 0 or srv.engine.n_cancelled > 0
    srv.wait(lambda: srv.engine.n_active == 0, "the choices to be cancelled")
    srv.wait(lambda: srv.cache.stats().blocks_used == 0, "the blocks to be freed")
