"""Which replica serves a request: the one whose KV cache most likely holds the longest prefix
of its prompt, unless that replica is much busier than the others.

No Ray here (goinfer/server/ray.py wires this into Ray Serve's request router), so the policy is
tested on its own.

A prompt's key is goinfer's own block hash chain (kv_cache.block_hash from root_hash(salt), one
hash per full block of prompt tokens, in exact mode): the i-th hash names the whole prefix of
i + 1 blocks, so "replica R holds hash i" means "R has seen this prompt's first i + 1 blocks".
For prompts prefilled in exact numerics (every block below 512 new tokens) these are the very
keys of the replica's cache; fast-prefilled blocks are stored under a fast-mode hash, and the
exact-mode chain is then a content key that names the same tokens.

The router does not ask replicas what they hold (that would cost a round trip per request);
it remembers which prompts it sent where (PrefixIndex), as many blocks per replica as that
replica's cache has, least recently used forgotten first, as the cache evicts.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from dataclasses import dataclass

from goinfer.kv_cache import EXACT, block_hash, root_hash

POLICIES = ("prefix", "least_loaded", "random")


def prompt_chain(ids, block_size: int, salt: str | None = None) -> list[bytes]:
    """Chain hashes of the full blocks of ids a replica may reuse (every token but the last one
    is reusable: a prompt always prefills at least one token)."""
    ids = [int(t) for t in ids]
    out: list[bytes] = []
    parent = root_hash(salt)
    for i in range(max(len(ids) - 1, 0) // block_size):
        parent = block_hash(parent, ids[i * block_size : (i + 1) * block_size], EXACT, salt)
        out.append(parent)
    return out


def instance_tag(replica_id: str) -> str:
    """A replica's short tag (8 hex digits of its id's SHA-256): the ids of the responses it
    stores carry it, so a request naming one is routed back to it."""
    return hashlib.sha256(replica_id.encode()).hexdigest()[:8]


# ============================================================================ policy


@dataclass(frozen=True)
class Policy:
    """How requests are spread over replicas.

    name:      "prefix" (longest cached prefix, see below), "least_loaded" (fewest requests in
               flight; ties at random) or "random".
    imbalance: under "prefix", a request leaves the replica with its longest prefix for the least
               loaded one when the former has more than this many requests in flight beyond the
               latter's (default 4: half a batch of 8; a replica that far ahead would queue the
               request behind a full batch while another has free seats).
    min_blocks: a match shorter than this many blocks counts as none (default 1); with no match
               the least loaded replica is chosen.
    """

    name: str = "prefix"
    imbalance: int = 4
    min_blocks: int = 1

    def __post_init__(self):
        if self.name not in POLICIES:
            raise ValueError(f"routing policy must be one of {POLICIES}, got {self.name!r}")
        if self.imbalance < 0 or self.min_blocks < 1:
            raise ValueError("imbalance must be >= 0 and min_blocks >= 1")


@dataclass
class Choice:
    ranking: list[str]  # replica ids, the chosen one first, then fallbacks (least loaded first)
    reason: str  # "prefix" | "no_match" | "imbalanced" | "least_loaded" | "random"
    matched: int  # blocks of the prompt the chosen replica is believed to hold


class PrefixIndex:
    """Per replica, the chain hashes of the prompts sent to it, most recently used last, at most
    capacity of them (the replica's KV cache blocks)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._held: dict[str, OrderedDict[bytes, None]] = {}

    def add(self, replica: str, chain: list[bytes]) -> None:
        held = self._held.setdefault(replica, OrderedDict())
        for h in reversed(chain):  # tail first: a chain's tail is forgotten before its head,
            held[h] = None  # as the cache evicts a released chain
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def match(self, replica: str, chain: list[bytes]) -> int:
        """How many leading blocks of chain the replica is believed to hold."""
        held = self._held.get(replica)
        if not held:
            return 0
        n = 0
        while n < len(chain) and chain[n] in held:
            n += 1
        return n

    def drop(self, replica: str) -> None:
        self._held.pop(replica, None)

    def keep_only(self, replicas) -> None:
        for r in set(self._held) - set(replicas):
            del self._held[r]

    def replicas(self) -> list[str]:
        return list(self._held)

    def blocks(self, replica: str) -> int:
        return len(self._held.get(replica, ()))


class KeyIndex:
    """Conversation key (a request's cache_key: OpenAI's prompt_cache_key, a client's session
    id) -> the replica its last request went to, for the capacity most recently used keys."""

    def __init__(self, capacity: int = 1 << 14):
        self.capacity = capacity
        self._at: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str | None) -> str | None:
        return self._at.get(key) if key else None

    def set(self, key: str | None, replica: str) -> None:
        if not key:
            return
        self._at[key] = replica
        self._at.move_to_end(key)
        while len(self._at) > self.capacity:
            self._at.popitem(last=False)

    def keep_only(self, replicas) -> None:
        live = set(replicas)
        for k in [k for k, r in self._at.items() if r not in live]:
            del self._at[k]


def choose(
    chain: list[bytes],
    loads: dict[str, int],
    index: PrefixIndex,
    policy: Policy,
    rng: random.Random | None = None,
    preferred: str | None = None,
) -> Choice:
    """Rank the replicas of loads (replica id -> requests in flight) for a prompt's chain.
    preferred: the replica the request's conversation key went to last (KeyIndex); under
    "prefix" it is chosen first, unless it is imbalanced as a longest-prefix replica would be
    (a key's conversation is cached where it went, whatever the ingress could compute of its
    chain: a request continuing a stored response has only its new input to hash)."""
    if not loads:
        raise ValueError("no replica to choose from")
    rng = rng or random
    ids = list(loads)
    rng.shuffle(ids)  # ties go to a random replica, not always the first listed
    by_load = sorted(ids, key=lambda r: loads[r])  # stable: shuffled order among equals

    def ranked(first: str, reason: str, matched: int) -> Choice:
        return Choice([first] + [r for r in by_load if r != first], reason, matched)

    if policy.name == "random":
        return ranked(ids[0], "random", index.match(ids[0], chain))
    if policy.name == "least_loaded":
        return ranked(by_load[0], "least_loaded", index.match(by_load[0], chain))
    if preferred in loads:
        if loads[preferred] - loads[by_load[0]] > policy.imbalance:
            return ranked(by_load[0], "imbalanced", index.match(by_load[0], chain))
        return ranked(preferred, "key", index.match(preferred, chain))
    matches = {r: index.match(r, chain) for r in ids}
    best = max(by_load, key=lambda r: matches[r])  # longest match; among equals least loaded
    if matches[best] < policy.min_blocks:
        return ranked(by_load[0], "no_match", matches[by_load[0]])
    if loads[best] - loads[by_load[0]] > policy.imbalance:
        return ranked(by_load[0], "imbalanced", matches[by_load[0]])
    return ranked(best, "prefix", matches[best])
