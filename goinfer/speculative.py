"""Speculative decoding that changes no output: prompt-lookup drafts verified in one forward call.

An agent's reply copies a lot from its context (identifiers, paths, the lines of a file it
edits).  Prompt lookup guesses the next tokens from that: find the most recent earlier
occurrence of the longest n-gram (NGRAM_MAX down to NGRAM_MIN tokens) that ends the context
(prompt + generated tokens) and propose the (up to k) tokens that followed it.

Verification: the last sampled token t and the draft d1..dk are computed in ONE forward call
(a short prefill, logits of every row).  A row's bits do not depend on how the tokens are
batched (the numerics contract: its attention kernel is chosen by its position), so row i is
bit-identical to the logits a decode step of the same token would give.  The Generation then
samples from row 0 exactly as plain decoding samples after t; if the sampled token equals d1,
row 1 is the next logits, and so on; on the first mismatch the sampled token is what plain
decoding would have sampled too, the session's KV is cut back to the accepted tokens, and the
next draft starts from it.  So every sampling draw (one per emitted token, from the same
random stream), every penalty, logit bias, grammar mask and logprob sees exactly what plain
decoding gives it: the output (tokens, text, finish reason, logprobs) is identical for the
same seed, greedy or sampled.  Only the time changes: a verify of 1 + k rows costs more than
one decode step (weights are read once, but every row is computed), so drafting pays when
drafts are accepted (copy-heavy replies) and the draft length adapts to recent acceptance.

``Speculation`` holds one generation's drafting state; ``Session.generate`` (pull: it asks
``next_logits`` for the logits after each token) and the server's engine (``feed``, then
``verified`` with the rows of its batched forward pass, then ``take`` per sample) drive it.
"""

from __future__ import annotations

import numpy as np

from goinfer.errors import CacheFullError, RequestError

PROMPT_LOOKUP = "prompt_lookup"
DRAFTS = (PROMPT_LOOKUP,)
DEFAULT_DRAFT_TOKENS = 16  # the most tokens one draft proposes (the span adapts below it)
MAX_DRAFT_TOKENS = 64
NGRAM_MAX = 6  # the longest suffix n-gram looked up
NGRAM_MIN = 2  # shorter suffixes are not matched (a single token proposes too much noise)


def check_draft(draft, draft_tokens) -> int:
    """Validate Session.generate's draft / draft_tokens -> tokens per draft (0: off)."""
    if draft is None:
        return 0
    if draft not in DRAFTS:
        raise RequestError(f"draft must be None or one of {list(DRAFTS)}, got {draft!r}", "draft")
    if (
        not isinstance(draft_tokens, (int, np.integer))
        or isinstance(draft_tokens, bool)
        or not 1 <= draft_tokens <= MAX_DRAFT_TOKENS
    ):
        raise RequestError(
            f"draft_tokens must be an int in 1..{MAX_DRAFT_TOKENS}, got {draft_tokens!r}",
            "draft_tokens",
        )
    return int(draft_tokens)


# ============================================================================ drafting


def prompt_lookup(
    context: np.ndarray, k: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN
) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest n-gram
    (ngram_max .. ngram_min tokens) ending context (L,) int; [] when none occurs."""
    L = len(context)
    if k <= 0:
        return []
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        pat = context[L - n :]
        # starts i in 0 .. L-n-1: context[i:i+n] == pat and a token follows it before the end
        hit = context[: L - n] == pat[0]
        for j in range(1, n):
            hit &= context[j : L - n + j] == pat[j]
        idx = np.flatnonzero(hit)
        if len(idx):
            i = int(idx[-1]) + n
            return context[i : i + k].tolist()
    return []


# ============================================================================ one generation


class Speculation:
    """Drafting and verification for one Generation (``gen``) whose prompt was ``prompt``.

    The rows of the last verify call are ``rows`` (len(fed), vocab): rows[i] is the logits
    after fed[i]; ``taken`` of them went to the generation.  ``base`` is the session's token
    count before that call."""

    def __init__(self, prompt, k: int):
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.k = int(k)
        self.span = self.k  # tokens to draft next: shrinks after rejections, regrows
        self.fed: list[int] = []
        self.rows: np.ndarray | None = None
        self.taken = 0
        self.base = 0

    # ------------------------------------------------------------------ drafting

    def feed(self, gen, n_held: int, n_ctx: int) -> list[int]:
        """The tokens to compute next: gen's last token (sampled, not computed yet) and up to
        span drafted ones, as many as gen may still sample (max_tokens) and the context holds
        (n_held tokens are computed).  Counts the drafted tokens in gen.drafted."""
        t = gen.tokens[-1]
        room = min(self.span, gen.max_tokens - len(gen.tokens) - 1, n_ctx - n_held - 1)
        draft = []
        if room > 0:
            ctx = np.concatenate([self.prompt, np.asarray(gen.tokens, dtype=np.int64)])
            draft = prompt_lookup(ctx, room)
        gen.drafted += len(draft)
        return [t] + draft

    def verified(self, fed: list[int], rows: np.ndarray, base: int) -> None:
        """The forward call of fed (whose first token sits at position base) gave rows."""
        self.fed, self.rows, self.taken, self.base = fed, rows, 0, base

    # ------------------------------------------------------------------ verification

    def take(self, gen) -> np.ndarray | None:
        """The next logits for gen from the verified rows, or None: row 0 always, row i when
        gen's last sampled token is fed[i] (the draft token was accepted)."""
        i = self.taken
        if self.rows is None or i >= len(self.fed):
            return None
        if i > 0:
            if gen.done or not gen.tokens or gen.tokens[-1] != self.fed[i]:
                return None
            gen.accepted += 1
        self.taken = i + 1
        return self.rows[i]

    def settle(self, session) -> None:
        """Cut the session back to the tokens whose logits were taken (the rejected drafts'
        KV is dropped); adapt the draft length to how much of this draft was accepted."""
        if self.rows is None:
            return
        drafted = len(self.fed) - 1
        accepted = self.taken - 1
        session.truncate(self.base + self.taken)
        if drafted:
            # all accepted: propose twice as many next time (up to k); else one more than
            # this draft held (a verify row costs ~0.3 decode steps, a rejected one is waste)
            self.span = min(self.k, 2 * self.span) if accepted == drafted else accepted + 1
        self.rows, self.fed, self.taken = None, [], 0

    # ------------------------------------------------------------------ Session.generate

    def next_logits(self, session, gen) -> np.ndarray:
        """The logits after gen's last token (pull style): a verified row when the draft holds,
        else settle, draft and verify (or a plain decode step when nothing is drafted)."""
        lg = self.take(gen)
        if lg is not None:
            return lg
        self.settle(session)
        fed = self.feed(gen, session.n_tokens, session.model.n_ctx)
        if len(fed) == 1:
            return session.decode(fed[0])
        base = session.n_tokens
        try:
            rows = session.extend(fed)
        except CacheFullError:  # no room for the draft (nothing was appended): plain decoding
            gen.drafted -= len(fed) - 1
            return session.decode(fed[0])
        self.verified(fed, rows, base)
        return self.take(gen)
