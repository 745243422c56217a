"""Log-probabilities of generated tokens, in OpenAI's shapes.

A token's logprob is the log-softmax of the raw logits the sampler was given for that step
(the model's output: before logit bias, penalties, temperature, top-k/p and grammar masks),
as OpenAI documents it.  Chat shape, per generated token::

    {"token": "Hello", "logprob": -0.31, "bytes": [72, 101, 108, 108, 111],
     "top_logprobs": [{"token": ..., "logprob": ..., "bytes": [...]}, ...]}   # best first

``legacy()`` turns a list of those into the /v1/completions shape (tokens, token_logprobs,
top_logprobs as {token: logprob} dicts, text_offset).
"""

from __future__ import annotations

import numpy as np

MAX_TOP_LOGPROBS = 20


def check_request(logprobs, top_logprobs) -> tuple[bool, int]:
    """Validate the Python API's (logprobs, top_logprobs) -> (on, top); RequestError."""
    from goinfer.errors import RequestError

    if not isinstance(logprobs, (bool, np.bool_)):
        raise RequestError(f"logprobs must be True or False, got {logprobs!r}", "logprobs")
    if top_logprobs is None:
        top_logprobs = 0
    if (
        isinstance(top_logprobs, bool)
        or not isinstance(top_logprobs, (int, np.integer))
        or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS
    ):
        raise RequestError(
            f"top_logprobs must be an int in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs!r}",
            "top_logprobs",
        )
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs needs logprobs=True", "top_logprobs")
    return bool(logprobs), int(top_logprobs)


def log_softmax_at(
    logits: np.ndarray, token: int, top: int
) -> tuple[float, list[tuple[int, float]]]:
    """(logprob of token, [(id, logprob)] of the `top` most likely, best first, ties by id)
    under log-softmax(logits), computed in float64."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)  # (vocab,)
    m = float(z.max())
    lse = m + float(np.log(np.exp(z - m).sum()))
    best = []
    if top > 0:
        k = min(top, len(z))
        idx = np.argpartition(-z, k - 1)[:k]
        idx = idx[np.lexsort((idx, -z[idx]))]
        best = [(int(i), float(z[i] - lse)) for i in idx]
    return float(z[int(token)] - lse), best


def token_text(tokenizer, token: int) -> tuple[str, list[int]]:
    """(text, UTF-8 bytes) of one token; a token that is not whole UTF-8 reads "bytes:\\xNN"."""
    raw = tokenizer.token_bytes(int(token))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return text, list(raw)


def entry(tokenizer, logits: np.ndarray, token: int, top: int) -> dict:
    """The chat-shaped logprobs entry of `token` sampled from `logits`."""
    lp, best = log_softmax_at(logits, token, top)
    text, raw = token_text(tokenizer, token)
    tops = []
    for i, v in best:
        t, b = token_text(tokenizer, i)
        tops.append({"token": t, "logprob": v, "bytes": b})
    return {"token": text, "logprob": lp, "bytes": raw, "top_logprobs": tops}


def legacy(entries: list[dict], text_offset0: int = 0) -> dict:
    """Chat-shaped entries -> the /v1/completions logprobs object.  Each top_logprobs dict holds
    the top tokens and the sampled one (so up to top+1 entries, as OpenAI)."""
    tokens, lps, tops, offs = [], [], [], []
    off = text_offset0
    for e in entries:
        tokens.append(e["token"])
        lps.append(e["logprob"])
        d = {t["token"]: t["logprob"] for t in e["top_logprobs"]}
        if e["top_logprobs"] and e["token"] not in d:
            d[e["token"]] = e["logprob"]
        tops.append(d)
        offs.append(off)
        off += len(bytes(e["bytes"]).decode("utf-8", errors="ignore"))
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}
