"""The replica choice of goinfer/server/routing.py, without Ray: the chain is the cache's own
keys, the index forgets like the cache, and choose() follows its stated rule."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goinfer import KVCache
from goinfer.gguf import GGUFFile
from goinfer.model import Model
from goinfer.server.routing import (
    KeyIndex,
    Policy,
    PrefixIndex,
    choose,
    instance_tag,
    prompt_chain,
)


@pytest.fixture(scope="module")
def model(tiny):
    return Model(GGUFFile(tiny("llama", 3)[1]), threads=1, progress=False)


def test_chain_is_the_keys_a_session_stores(model):
    """After a session prefills a prompt (exact numerics), every hash of prompt_chain is a block
    the cache returns for lookup, and a salt gives another chain that the cache does not hold."""
    cache = KVCache(model, max_tokens=1024)
    ids = [int(x) for x in random.Random(1).choices(range(256), k=75)]  # 4 full blocks + 11
    s = model.session(cache, cache_salt="alice")
    s.generate(ids, max_tokens=2)
    chain = prompt_chain(ids, cache.block_size, "alice")
    assert len(chain) == (len(ids) - 1) // cache.block_size == 4
    for h in chain:
        b = cache.lookup(h)
        assert b is not None
        cache.release([b])
    other = prompt_chain(ids, cache.block_size, "bob")
    assert all(cache.lookup(h) is None for h in other)
    # the chain stops one token short of the prompt, as the cache's reuse does
    assert len(prompt_chain(ids[:33], 16)) == 2 and len(prompt_chain(ids[:32], 16)) == 1
    assert prompt_chain(ids[:1], 16) == [] and prompt_chain([], 16) == []
    # one chain hash names the whole prefix: change the first token, every hash changes
    assert not set(prompt_chain([ids[0] + 1] + ids[1:], 16)) & set(prompt_chain(ids, 16))


def test_index_matches_leading_blocks_and_forgets_oldest_first():
    a = prompt_chain(list(range(100)), 16)  # 6 blocks
    b = prompt_chain(list(range(50)) + [999] * 50, 16)  # shares a's first 3 blocks
    idx = PrefixIndex(capacity=8)
    idx.add("r1", a)
    assert idx.match("r1", a) == 6 and idx.match("r1", b) == 3 and idx.match("r2", a) == 0
    idx.add("r1", b)  # 3 new hashes: 9 > 8 and one goes
    assert idx.blocks("r1") == 8
    # b touched a's head again, so the least recently used hash is a's tail
    assert idx.match("r1", b) == 6
    assert idx.match("r1", a) == 5
    idx.keep_only(["r2"])
    assert idx.match("r1", a) == 0
    idx.add("r2", a)
    idx.drop("r2")
    assert idx.blocks("r2") == 0
    with pytest.raises(ValueError):
        PrefixIndex(0)


def test_choose_prefix_imbalance_and_fallbacks():
    chain = prompt_chain(list(range(80)), 16)  # 4 blocks
    idx = PrefixIndex(100)
    idx.add("a", chain)
    idx.add("b", chain[:2])
    pol = Policy("prefix", imbalance=4)
    c = choose(chain, {"a": 3, "b": 0, "c": 1}, idx, pol)
    assert (c.ranking, c.reason, c.matched) == (["a", "b", "c"], "prefix", 4)
    c = choose(chain, {"a": 5, "b": 0, "c": 1}, idx, pol)  # 5 - 0 > 4: least loaded
    assert (c.ranking[0], c.reason) == ("b", "imbalanced")
    c = choose(chain, {"a": 4, "b": 0}, idx, pol)  # exactly the threshold: still the prefix
    assert c.ranking[0] == "a"
    c = choose(prompt_chain([7] * 80, 16), {"a": 2, "b": 1, "c": 3}, idx, pol)  # nobody holds it
    assert (c.ranking, c.reason) == (["b", "a", "c"], "no_match")
    c = choose([], {"a": 2, "b": 1}, idx, pol)  # no chain (a GET, a refused request)
    assert c.ranking[0] == "b"
    c = choose(chain, {"a": 9, "b": 0}, idx, Policy("least_loaded"))
    assert (c.ranking[0], c.reason) == ("b", "least_loaded")
    seen = {
        choose(chain, {"a": 9, "b": 0}, idx, Policy("random"), random.Random(i)).ranking[0]
        for i in range(20)
    }
    assert seen == {"a", "b"}
    with pytest.raises(ValueError):
        Policy("sticky")
    with pytest.raises(ValueError):
        choose(chain, {}, idx, pol)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12)), min_size=1, max_size=5),
    st.integers(0, 6),
    st.integers(0, 10**6),
)
def test_choose_follows_the_stated_rule(reps, imbalance, seed):
    """Independent statement of the rule: the chosen replica holds the longest prefix (among
    those, one of the least loaded) unless no replica holds a block, or it has more than
    `imbalance` requests beyond the least loaded replica; then it is one of the least loaded."""
    chain = prompt_chain(list(range(16 * 4 + 1)), 16)
    idx = PrefixIndex(1000)
    loads = {}
    for i, (m, load) in enumerate(reps):
        idx.add(f"r{i}", chain[:m])
        loads[f"r{i}"] = load
    c = choose(chain, loads, idx, Policy("prefix", imbalance), random.Random(seed))
    assert sorted(c.ranking) == sorted(loads)
    assert [loads[r] for r in c.ranking[1:]] == sorted(loads[r] for r in c.ranking[1:])
    low = min(loads.values())
    best = max(m for m, _ in reps)
    top = [r for i, r in enumerate(loads) if reps[i][0] == best]
    top_low = min(loads[r] for r in top)
    got = c.ranking[0]
    if best == 0 or top_low - low > imbalance:
        assert loads[got] == low
    else:
        assert got in top and loads[got] == top_low


def test_a_conversation_key_goes_where_it_went_unless_imbalanced():
    idx, pol = PrefixIndex(100), Policy("prefix", imbalance=4)
    chain = prompt_chain(list(range(64)), 16)
    idx.add("a", chain)
    # the key's replica first, even against a longer prefix elsewhere (a request continuing a
    # stored response has only its new input to hash)
    c = choose(chain, {"a": 0, "b": 1}, idx, pol, preferred="b")
    assert (c.ranking[0], c.reason) == ("b", "key")
    c = choose(chain, {"a": 0, "b": 5}, idx, pol, preferred="b")  # 5 - 0 > 4
    assert (c.ranking[0], c.reason) == ("a", "imbalanced")
    c = choose(chain, {"a": 0, "b": 1}, idx, pol, preferred="gone")  # not a replica any more
    assert (c.ranking[0], c.reason) == ("a", "prefix")
    keys = KeyIndex(capacity=2)
    keys.set("k1", "a")
    keys.set("k2", "b")
    keys.set("k3", "a")  # k1 forgotten, the least recently used
    assert (keys.get("k1"), keys.get("k2"), keys.get("k3"), keys.get(None)) == (
        None,
        "b",
        "a",
        None,
    )
    keys.keep_only(["b"])
    assert keys.get("k3") is None and keys.get("k2") == "b"


def test_instance_tags_are_short_and_stable():
    t = instance_tag("SERVE_REPLICA::goinfer#GoinferReplica#abc")
    assert re.fullmatch("[0-9a-f]{8}", t) and t == instance_tag(
        "SERVE_REPLICA::goinfer#GoinferReplica#abc"
    ) != instance_tag("other")
