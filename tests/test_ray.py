"""goinfer replicas on Ray Serve (goinfer/server/ray.py): two replicas of a tiny model behind one
OpenAI endpoint, driven by the official openai client and raw httpx.  One local Ray instance for
the module (started and stopped here); the replica-killing test runs last."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

# the local Ray instance keeps its control plane on loopback (Ray reads this when imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
from ray import serve  # noqa: E402
from test_server import Server, sse_events  # noqa: E402

from goinfer import cli  # noqa: E402
from goinfer.gguf import GGUFFile  # noqa: E402
from goinfer.model import Model  # noqa: E402
from goinfer.server import ray as goinfer_ray  # noqa: E402
from goinfer.server.cli import free_port  # noqa: E402
from goinfer.server.ray import REPLICA_HEADER, ReplicaSpec  # noqa: E402

KEY = "test-key"
APP = "goinfer"
BLOCK = 16


@pytest.fixture(scope="module")
def tiny_path(tiny):
    return tiny("llama", 3, max_position_embeddings=4096)[1]


@pytest.fixture(scope="module")
def cluster(tiny_path):
    port = free_port()
    try:
        # what `goinfer serve MODEL --replicas 2 --threads-per-replica 1` runs; 8 logical CPUs
        # so that the benchmark's smoke run fits beside the two replicas
        goinfer_ray.run(
            ReplicaSpec(str(tiny_path), model_id="tiny", api_key=KEY),
            replicas=2,
            threads_per_replica=1,
            port=port,
            num_cpus=8,
        )
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", port=port)
    finally:
        goinfer_ray.stop()


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(GGUFFile(tiny_path), threads=1, progress=False)


def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def post(cluster, path, body, **kw):
    return httpx.post(
        cluster.url + path, json=body, timeout=120, headers={"Authorization": f"Bearer {KEY}"}, **kw
    )


def banned(model) -> dict:
    return {str(t): -100 for t in model.tokenizer.stop_ids}


def replica_names() -> set[str]:
    return {
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::{APP}#GoinferReplica#")
    }


# ============================================================================ the OpenAI API


def test_cli_maps_options_to_the_app(monkeypatch, tiny_path):
    """`goinfer serve MODEL --replicas ...` hands run() the replica spec (every per-process
    field of the flags: test_serve_options.py checks each flag's field and the app a spec
    builds), the routing policy and the log level (run itself is what the cluster fixture
    starts)."""
    from goinfer.server.cli import serve_options

    got = {}
    monkeypatch.setattr(goinfer_ray, "run", lambda spec, **kw: got.update(spec=spec, **kw))
    monkeypatch.setattr(goinfer_ray, "wait", lambda: None)
    monkeypatch.setattr(goinfer_ray, "stop", lambda joined: got.update(stopped=joined))
    argv = [
        "serve",
        str(tiny_path),
        "--replicas",
        "3",
        "--threads-per-replica",
        "2",
        "--ray-address",
        "auto",
        "--route",
        "random",
        "--route-imbalance",
        "7",
        "--max-batch",
        "4",
        "--api-key",
        "k",
        "--port",
        "9001",
        "--kv-dtype",
        "f32",
        "--log-level",
        "warning",
    ]
    assert cli.main(argv) == 0
    spec = got["spec"]
    assert spec == serve_options(cli.build_parser().parse_args(argv)).spec
    assert (spec.model, spec.max_batch, spec.api_key, spec.kv_dtype) == (
        str(tiny_path),
        4,
        "k",
        "f32",
    )
    assert (got["replicas"], got["threads_per_replica"], got["ray_address"], got["port"]) == (
        3,
        2,
        "auto",
        9001,
    )
    assert (got["policy"].name, got["policy"].imbalance, got["stopped"]) == ("random", 7, True)
    assert got["log_level"] == "warning"


def test_openai_client_streamed_and_not(cluster):
    c = client(cluster)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = httpx.get(cluster.url + "/v1/models")  # the replica's own 401, relayed
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    m = [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Say something about caches."},
    ]
    raw = c.chat.completions.with_raw_response.create(
        model="tiny", messages=m, max_tokens=20, temperature=0
    )
    assert raw.headers[REPLICA_HEADER] in replica_names()
    full = raw.parse()
    d = full.model_dump()
    assert full.usage.completion_tokens == 20 or full.choices[0].finish_reason == "stop"
    cached = full.usage.prompt_tokens_details.cached_tokens  # whole blocks of 16, never all
    assert cached % 16 == 0 and 0 <= cached < full.usage.prompt_tokens, cached
    assert d["timings"]["prompt_n"] + d["timings"]["cache_n"] == full.usage.prompt_tokens
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=m,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= BLOCK  # the same prompt again
    cmp = c.completions.create(model="tiny", prompt="the cat sat on", max_tokens=6, temperature=0)
    assert cmp.usage.completion_tokens <= 6 and cmp.choices[0].finish_reason in ("length", "stop")
    bad = post(cluster, "/v1/chat/completions", {"messages": m, "n": 0})  # the app's own 400
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    two = post(
        cluster, "/v1/chat/completions", {"messages": m, "n": 2, "max_tokens": 4, "seed": 1}
    )  # n > 1 through a replica
    assert two.status_code == 200 and [ch["index"] for ch in two.json()["choices"]] == [0, 1]


# Requests sent to both servers; non-streaming ones return their token ids.
SAME = [
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Tell me about item 1."}],
            "max_tokens": 24,
            "temperature": 0,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "And item 2?"},
            ],
            "max_tokens": 24,
            "temperature": 0.9,
            "seed": 7,
            "top_k": 40,
        },
    ),
    ("/v1/completions", {"prompt": "the quick brown fox", "max_tokens": 20, "temperature": 0}),
    ("/v1/completions", {"prompt": [5, 17, 99, 200, 3], "max_tokens": 12, "temperature": 0}),
]


def test_bit_identical_to_single_process(cluster, model):
    """Greedy (and seeded) results through Ray equal the single-process server's, streamed and
    not: token ids, text, finish reason, token counts."""
    with Server(model) as one:
        for path, body in SAME:
            a = post(cluster, path, dict(body, return_tokens=True)).json()
            b = one.post(path, dict(body, return_tokens=True)).json()
            assert a["tokens"] == b["tokens"] and len(a["tokens"]) > 0
            assert a["choices"] == b["choices"]
            for k in ("prompt_tokens", "completion_tokens"):
                assert a["usage"][k] == b["usage"][k]
            sa = sse_events(post(cluster, path, dict(body, stream=True)).text)
            sb = sse_events(one.post(path, dict(body, stream=True)).text)
            assert sa[-1] == sb[-1] == "[DONE]"
            assert [e["choices"] for e in sa[:-1]] == [e["choices"] for e in sb[:-1]]


# ============================================================================ routing


def test_conversation_stays_on_one_replica_and_reuses_its_cache(cluster):
    c = client(cluster)
    m = [
        {"role": "system", "content": "You are a careful agent. Answer in a few words."},
        {"role": "user", "content": "Turn one: list the files."},
    ]
    seen = []
    for turn in range(4):
        raw = c.chat.completions.with_raw_response.create(
            model="tiny", messages=m, max_tokens=8, temperature=0
        )
        r = raw.parse()
        seen.append(
            (
                raw.headers[REPLICA_HEADER],
                r.usage.prompt_tokens,
                r.usage.prompt_tokens_details.cached_tokens,
            )
        )
        m += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"Turn {turn + 2}: now read file {turn}."},
        ]
    assert len({rep for rep, _, _ in seen[1:]}) == 1, seen
    for (_, prev_prompt, _), (_, _, cached) in zip(seen, seen[1:]):
        assert cached >= prev_prompt - BLOCK, seen


def test_concurrent_conversations_stay_on_their_replicas(cluster):
    """4 conversations at once (no prefix in common), two turns each: each one's second turn
    goes where its first went, and the router's books say so (4 more prefix decisions, 8
    decisions in all, nothing left in flight).  With 4 requests in flight at most, no replica
    can be more than imbalance (4) ahead, so this holds however the requests interleave; how
    a burst is spread by the router's own in-flight counts is tested without timing below
    (test_router_spreads_a_burst_by_its_own_counts)."""
    words = ["alpha", "bravo", "charlie", "delta"]
    start = threading.Barrier(len(words))
    where: dict[int, list[str]] = {}
    errors = []
    ingress = serve.get_deployment_handle("GoinferIngress", app_name=APP)
    (before,) = ingress.routing_stats.remote().result()

    def talk(i: int) -> None:
        try:
            c = client(cluster)
            m = [{"role": "user", "content": f"{words[i]}: conversation {i}, first question."}]
            where[i] = []
            start.wait()
            for _ in range(2):
                raw = c.chat.completions.with_raw_response.create(
                    model="tiny", messages=m, max_tokens=32, temperature=0
                )
                where[i].append(raw.headers[REPLICA_HEADER])
                m += [
                    {"role": "assistant", "content": raw.parse().choices[0].message.content},
                    {"role": "user", "content": "second question."},
                ]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ths = [threading.Thread(target=talk, args=(i,)) for i in range(len(words))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not errors, errors
    assert all(len(w) == 2 and w[0] == w[1] for w in where.values()), where
    # the router's own books: 8 decisions, every second turn a prefix one; nothing in flight
    deadline = time.time() + 30  # completions reach the router asynchronously
    while True:
        (stats,) = ingress.routing_stats.remote().result()
        if not stats["in_flight"]:
            break
        assert time.time() < deadline, f"requests counted in flight after they completed: {stats}"
        time.sleep(0.05)
    grew = {k: v - before["decisions"].get(k, 0) for k, v in stats["decisions"].items()}
    assert sum(grew.values()) == 2 * len(words) and grew.get("prefix", 0) >= len(words), grew
    assert stats["policy"] == "prefix"
    assert {w[0] for w in where.values()} <= set(stats["index_blocks"]), stats


def test_router_spreads_a_burst_by_its_own_counts():
    """PrefixRouter in this process, over two fake replicas whose Ray queue lengths read 0 (Ray's
    view lags a burst): 8 requests routed before any completes go 4 and 4 (each to the replica
    with fewer of this router's requests in flight, counted at the decision); each one's second
    turn, after they all completed, goes where its first went (prefix); a replica Ray reports
    busy beyond the imbalance loses a prefix it holds."""
    import asyncio
    import random

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

    from goinfer.server.routing import prompt_chain

    dep = DeploymentID(name="GoinferReplica", app_name="test")
    router = goinfer_ray.PrefixRouter(dep, DeploymentHandleSource.UNKNOWN)
    router.initialize_state(policy="prefix", imbalance=4)
    reps = [SimpleNamespace(replica_id=ReplicaID(u, dep)) for u in ("r0", "r1")]
    name = {r.replica_id.to_full_id_str(): u for r, u in zip(reps, ("r0", "r1"))}

    def queue(r0: int, r1: int) -> None:
        for r, q in zip(reps, (r0, r1)):
            router.replica_queue_len_cache.update(r.replica_id, q)

    def request(rid: str, ids: list[int]):
        meta = SimpleNamespace(internal_request_id=rid)
        return SimpleNamespace(args=[{"chain": prompt_chain(ids, BLOCK)}], metadata=meta)

    def route(rid: str, ids: list[int]) -> str:
        ranking = asyncio.run(router.choose_replicas(reps, request(rid, ids)))
        return name[ranking[0][0].replica_id.to_full_id_str()]

    random.seed(3)  # ties (equal loads) go to a random replica: the same ones every run
    queue(0, 0)
    first = [list(range(100 * i, 100 * i + 40)) for i in range(8)]  # (8, 40), no prefix shared
    went = [route(f"a{i}", ids) for i, ids in enumerate(first)]
    # after each pair the two replicas hold as many: the second of a pair goes to the other one
    assert all(went[k] != went[k + 1] for k in range(0, 8, 2)), went
    for i, _ in enumerate(first):  # every first turn completes
        rep = reps[int(went[i][1])].replica_id
        router.on_request_completed(rep, f"a{i}")
    assert router.in_flight() == {}
    again = [route(f"b{i}", ids + [7] * 20) for i, ids in enumerate(first)]
    assert again == went, (went, again)
    assert router.stats()["decisions"] == {"no_match": 8, "prefix": 8}
    queue(9, 0)  # r0 far busier than r1 in Ray's view: its prefix is not worth the wait
    i = went.index("r0")
    assert route("c", first[i] + [7] * 30) == "r1"
    assert router.stats()["decisions"]["imbalanced"] == 1


def test_responses_keys_and_stored_ids_reach_their_replica(cluster):
    """POST /v1/responses through the ingress: requests with one prompt_cache_key and no prefix
    in common go to one replica (the key's); a stored response is read, continued and deleted
    on the replica that stored it (its id carries that replica's tag), whichever replica the
    prefix would pick."""
    c = client(cluster)
    for key in ("conv-a", "conv-b"):
        went = set()
        for i, word in enumerate(["alpha", "bravo", "charlie", "delta"]):
            raw = c.responses.with_raw_response.create(
                model="tiny",
                input=f"{word} {key} {i}",
                prompt_cache_key=key,
                max_output_tokens=4,
                temperature=0,
            )
            went.add(raw.headers[REPLICA_HEADER])
        assert len(went) == 1, (key, went)
    ingress = serve.get_deployment_handle("GoinferIngress", app_name=APP)
    (stats,) = ingress.routing_stats.remote().result()
    assert stats["decisions"].get("key", 0) >= 6, stats
    for i in range(4):
        raw = c.responses.with_raw_response.create(
            model="tiny", input=f"store {i}", max_output_tokens=4, temperature=0
        )
        first, home = raw.parse(), raw.headers[REPLICA_HEADER]
        got = httpx.get(
            f"{cluster.url}/v1/responses/{first.id}",
            timeout=120,
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert got.status_code == 200 and got.headers[REPLICA_HEADER] == home
        assert got.json()["id"] == first.id
        raw = c.responses.with_raw_response.create(
            model="tiny",
            input="and then?",
            previous_response_id=first.id,
            max_output_tokens=4,
            temperature=0,
        )
        assert raw.headers[REPLICA_HEADER] == home
        assert raw.parse().previous_response_id == first.id
        assert c.responses.delete(first.id) is None
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(first.id)
    (stats,) = ingress.routing_stats.remote().result()
    assert stats["decisions"].get("pinned", 0) >= 4 * 4, stats


def test_client_disconnect_cancels_the_job(cluster, model):
    """A client that leaves a stream has its job cancelled on the replica (the single-process
    server's behaviour, through the ingress and the Ray stream)."""
    body = {
        "messages": [{"role": "user", "content": "Another long story, please."}],
        "max_tokens": 3500,
        "temperature": 0,
        "stream": True,
        "logit_bias": banned(model),
    }

    def engine_counts(name):
        return ray.get(
            ray.get_actor(name, namespace="serve").__ray_call__.remote(
                lambda self: (lambda e: (e.n_cancelled, e.n_finished, e.n_active))(
                    serve.get_replica_context().servable_object.engine
                )
            )
        )

    with httpx.stream(
        "POST",
        cluster.url + "/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:
        name = r.headers[REPLICA_HEADER]
        cancelled0, finished0, _ = engine_counts(name)
        seen = ""
        for chunk in r.iter_text():
            seen += chunk
            if seen.count("data: ") >= 3:
                break  # leave: the connection closes
    deadline = time.time() + 30
    while True:
        cancelled, finished, active = engine_counts(name)
        if cancelled > cancelled0 and active == 0:
            break
        assert finished == finished0, "the job ran to its end: the disconnect did not reach it"
        assert time.time() < deadline, "the job was not cancelled"
        time.sleep(0.05)


def test_anthropic_messages_routed_by_prefix(cluster):
    """The Messages API through the ingress (parsed by its own route, tokenized, routed by the
    prompt's block chain): a conversation's later turns go to the replica that holds it and
    come from its cache; streams keep Anthropic's event lines; errors keep its shape."""
    import anthropic

    c = anthropic.Anthropic(base_url=cluster.url, api_key=KEY, max_retries=0, timeout=120)
    ingress = serve.get_deployment_handle("GoinferIngress", app_name=APP)

    def prefix_decisions() -> int:  # the router exists once a request went through it
        return sum(r["decisions"].get("prefix", 0) for r in ingress.routing_stats.remote().result())

    before = prefix_decisions()
    conv = [{"role": "user", "content": "Turn one: list the files of the project."}]
    system = "You are a careful coding agent. Answer in a few words, then stop."
    seen = []
    for turn in range(4):
        raw = c.messages.with_raw_response.create(
            model="tiny", max_tokens=8, system=system, messages=conv, extra_body={"temperature": 0}
        )
        r = raw.parse()
        u = r.usage
        seen.append(
            (
                raw.headers[REPLICA_HEADER],
                u.input_tokens + u.cache_read_input_tokens,
                u.cache_read_input_tokens,
            )
        )
        conv += [
            {"role": "assistant", "content": r.content[0].text},
            {"role": "user", "content": f"Turn {turn + 2}: now read file {turn}."},
        ]
    assert len({rep for rep, _, _ in seen[1:]}) == 1, seen
    for (_, prev_prompt, _), (_, _, cached) in zip(seen, seen[1:]):
        assert cached >= prev_prompt - BLOCK, seen
    assert prefix_decisions() - before >= 3
    with c.messages.stream(
        model="tiny", max_tokens=8, system=system, messages=conv, extra_body={"temperature": 0}
    ) as s:
        final = s.get_final_message()
    assert final.usage.cache_read_input_tokens >= seen[-1][1] - BLOCK
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="tiny", max_tokens=8, messages=conv, extra_body={"nope": 1})
    assert e.value.body["type"] == "error" and "nope" in e.value.body["error"]["message"]


# ============================================================================ benchmark


def test_benchmark_smoke(cluster, tiny_path, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import ray_load

    out = tmp_path / "r.json"
    assert ray_load.main(
        ["--smoke", "--model", str(tiny_path), "--port", str(cluster.port), "--json", str(out)]
    )["rows"]
    res = json.loads(out.read_text())
    rows = {r["config"]: r for r in res["rows"]}
    assert set(rows) == {"1 replica", "2 replicas, prefix", "2 replicas, random"}
    for r in rows.values():
        assert r["requests"] == r["agents"] * r["turns"] and r["tok_s"] > 0
        assert 0 <= r["hit_rate"] <= 1
    # one replica holds every agent's context: from its second turn on, each agent's prompt is
    # cached up to the last block
    assert rows["1 replica"]["hit_rate"] > 0.5


# ============================================================================ failure (last)


def test_replica_killed_mid_stream(cluster, model):
    """The stream in flight on a dying replica ends with an error event and [DONE]; requests
    sent meanwhile succeed on the other replica; Serve starts a replacement."""
    before = replica_names()
    assert len(before) == 2
    pids = {
        n: ray.get(
            ray.get_actor(n, namespace="serve").__ray_call__.remote(lambda self: os.getpid())
        )
        for n in before
    }
    body = {
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 3500,
        "temperature": 0,
        "stream": True,
        "logit_bias": banned(model),
    }
    victim = None
    with httpx.stream(
        "POST",
        cluster.url + "/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {KEY}"},
    ) as r:
        victim = r.headers[REPLICA_HEADER]
        text = ""
        for chunk in r.iter_text():
            text += chunk
            if victim in pids and text.count("data: ") >= 3:  # the role, then some text
                os.kill(pids.pop(victim), signal.SIGSTOP)  # freeze it mid-generation, then kill
                ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    err = events[-2]
    assert isinstance(err, dict) and err["error"]["code"] == "replica_failed", events[-3:]
    assert victim in err["error"]["message"]
    pieces = [
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    ]
    assert 0 < sum(len(p) > 0 for p in pieces) < 3500  # cut short, and said so
    # meanwhile: new requests route around the dead replica
    c = client(cluster)
    for i in range(4):
        raw = c.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"after the crash {i}"}],
            max_tokens=4,
            temperature=0,
        )
        assert raw.status_code == 200 and raw.headers[REPLICA_HEADER] != victim
    # Serve replaces the dead replica
    deadline = time.time() + 90
    while True:
        now = replica_names()
        if len(now) == 2 and victim not in now:
            break
        assert time.time() < deadline, f"no replacement replica: {now}"
        time.sleep(0.5)
    new = (now - before).pop()
    i = 0
    while True:  # the new replica serves too, once Serve reports it running
        raw = c.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"{i} later"}],
            max_tokens=4,
            temperature=0,
        )
        assert raw.status_code == 200
        if raw.headers[REPLICA_HEADER] == new:
            break
        assert time.time() < deadline, "the replacement replica never served a request"
        i += 1
        time.sleep(0.1)
