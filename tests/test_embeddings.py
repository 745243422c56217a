"""Embeddings of an embedding model (goinfer/embeddings.py, POST /v1/embeddings) and llama.cpp's
/tokenize and /detokenize.

The embedding model is a tiny random Qwen3 built as Qwen3-Embedding is (tied embeddings, a
sentence-transformers Pooling module, a tokenizer that appends <|endoftext|>) and converted by
llama.cpp's own convert_hf_to_gguf.py, which writes its qwen3.pooling_type.  The reference is
transformers' base model on the Hugging Face tokenizer's ids, pooled as the model card and
sentence-transformers do (last token / mean / first token) and L2-normalised."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
from test_server import Server, msgs

from fixtures import hfconvert
from fixtures.compare import load
from goinfer import KVCache
from goinfer.embeddings import embed
from goinfer.errors import RequestError
from goinfer.gguf import GGUFFile

TEXTS = ["Hello world, the cat sat on the mat.", "Good night.", "the theory of everything " * 9]
POOLING_TYPES = {"mean": 1, "cls": 2, "lasttoken": 3}  # llama.cpp's enum, as the GGUF holds it


@pytest.fixture(scope="module", params=["lasttoken", "mean", "cls"])
def embedder(request):
    hf, path = hfconvert.build("qwen3", pooling=request.param)
    return request.param, hf, path, load(path)


def reference(hf, path, pooling: str) -> tuple[list[list[int]], np.ndarray]:
    """(the Hugging Face tokenizer's ids of TEXTS, transformers' embeddings of them)."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path.parent / "hf" / "tokenizer.json"))
    out, ids = [], []
    for text in TEXTS:
        x = tok.encode(text).ids
        with torch.no_grad():
            h = hf.model(torch.tensor([x])).last_hidden_state[0]  # (T, D), after the final norm
        v = {"lasttoken": h[-1], "mean": h.mean(dim=0), "cls": h[0]}[pooling]
        out.append(torch.nn.functional.normalize(v, p=2, dim=0).numpy())
        ids.append(x)
    return ids, np.stack(out)


def test_embeddings_equal_transformers(embedder):
    pooling, hf, path, model = embedder
    assert GGUFFile(path).get("qwen3.pooling_type") == POOLING_TYPES[pooling]
    assert model.pooling == {"lasttoken": "last"}.get(pooling, pooling)
    ref_ids, ref = reference(hf, path, pooling)
    ids = [model.tokenize(t, add_special=True) for t in TEXTS]
    assert ids == ref_ids  # <|endoftext|> appended, as the HF tokenizer does
    got = embed(model, ids)
    assert got.shape == (len(TEXTS), hf.config.hidden_size) and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-5, np.abs(got - ref).max()
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_a_model_that_does_not_embed_is_refused(tiny):
    m = load(tiny("llama", 3)[1])
    assert m.pooling is None
    with pytest.raises(RequestError) as e:
        embed(m, [[1, 2, 3]])
    assert e.value.param == "model"


# ============================================================================ the server


@pytest.fixture(scope="module")
def emb_srv():
    hf, path = hfconvert.build("qwen3", pooling="lasttoken")
    m = load(path)
    with Server(m, KVCache(m, max_tokens=1024)) as s:
        yield s, hf, path, m


def test_embeddings_route(emb_srv):
    """The openai client (which asks for base64 and decodes it) and raw floats give the
    library's vectors; token-id inputs; usage counts the input tokens."""
    s, hf, path, m = emb_srv
    ids = [m.tokenize(t, add_special=True) for t in TEXTS]
    want = embed(m, ids)
    r = s.client().embeddings.create(model="tiny", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2]
    assert np.array_equal(np.array([d.embedding for d in r.data], np.float32), want)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    raw = s.post("/v1/embeddings", {"model": "x", "input": ids[1], "encoding_format": "float"})
    assert raw.status_code == 200, raw.text
    body = raw.json()
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert np.array_equal(np.array(body["data"][0]["embedding"], np.float32), want[1])
    b64 = s.post("/v1/embeddings", {"input": [TEXTS[0]], "encoding_format": "base64"}).json()
    assert np.array_equal(
        np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4"), want[0]
    )
    _, ref = reference(hf, path, "lasttoken")
    assert np.abs(want - ref).max() <= 1e-5
    # the same vectors while the engine generates (it shares the model)
    gen = s.client().chat.completions.create(model="tiny", messages=msgs("hi"), max_tokens=4)
    assert gen.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[1, 99999]]}, "input"),
        ({"input": 5}, "input"),
        ({"input": "x", "dimensions": 3}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "nope": 1}, "nope"),
        ({"input": "x " * 2000}, "input"),
    ],
)
def test_bad_embedding_bodies(emb_srv, body, param):
    r = emb_srv[0].post("/v1/embeddings", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_embeddings_of_a_generation_model_are_a_400(tiny):
    with Server(load(tiny("llama", 3)[1])) as s:
        with pytest.raises(openai.BadRequestError) as e:
            s.client().embeddings.create(model="tiny", input="hello")
        assert e.value.body["param"] == "model" and "embedding model" in e.value.body["message"]


# ============================================================================ tokens


@pytest.fixture(scope="module")
def tok_srv(tiny):
    m = load(tiny("llama", 5, max_position_embeddings=4096)[1])
    with Server(m, KVCache(m, max_tokens=4096)) as s:
        yield s, m


def test_tokenize_detokenize(tok_srv):
    """llama.cpp's shapes; the ids are the ones a completion of the text uses (the same
    greedy reply from the ids as from the text), and detokenize gives the text back."""
    s, m = tok_srv
    text = "Hello world, the cat sat <|im_start|> on the mat."
    plain = s.post("/tokenize", {"content": text}).json()["tokens"]
    full = s.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    assert full[len(full) - len(plain) :] == plain  # add_special: a BOS if the model wants one
    assert len(full) - len(plain) == int(m.tokenizer.add_bos)
    assert m.tokenizer.token_to_id("<|im_start|>") in plain  # parse_special defaults to true
    raw = s.post("/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert m.tokenizer.token_to_id("<|im_start|>") not in raw
    a = s.post(
        "/v1/completions",
        {"prompt": text, "max_tokens": 6, "temperature": 0, "return_tokens": True},
    ).json()
    b = s.post(
        "/v1/completions",
        {"prompt": full, "max_tokens": 6, "temperature": 0, "return_tokens": True},
    ).json()
    assert a["usage"]["prompt_tokens"] == len(full) and a["tokens"] == b["tokens"]
    assert s.post("/detokenize", {"tokens": plain}).json() == {"content": text}
    pieces = s.post("/tokenize", {"content": "the cat", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "the cat" and all("id" in p for p in pieces)


def test_tokenize_adds_the_special_tokens_the_tokenizer_adds(emb_srv):
    """add_special: the Hugging Face tokenizer's ids (Qwen3-Embedding's appends <|endoftext|>,
    the token it pools); without it, the same ids but that one."""
    s, _, path, _ = emb_srv
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path.parent / "hf" / "tokenizer.json"))
    for text in TEXTS:
        want = tok.encode(text).ids
        full = s.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"]
        plain = s.post("/tokenize", {"content": text}).json()["tokens"]
        assert full == want and plain == want[:-1], text
        assert want[-1] == tok.token_to_id("<|endoftext|>")


def test_tokenize_a_chat(tok_srv):
    """A Chat Completions body counts the chat prompt exactly as the chat route renders it
    (tools in the prompt included)."""
    s, _ = tok_srv
    tools = [
        {
            "type": "function",
            "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    body = {"messages": msgs("What time is it?", system="Be brief."), "tools": tools}
    toks = s.post("/tokenize", body).json()["tokens"]
    r = s.post("/v1/chat/completions", dict(body, max_tokens=1)).json()
    assert len(toks) == r["usage"]["prompt_tokens"]
    assert len(s.post("/tokenize", {"messages": body["messages"]}).json()["tokens"]) < len(toks)


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "nope": 1}, "nope"),
        ("/tokenize", {"messages": "hi"}, "messages"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_bad_token_bodies(tok_srv, path, body, param):
    r = tok_srv[0].post(path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_token_routes_need_the_api_key(tiny):
    with Server(load(tiny("llama", 3)[1]), api_key="k") as s:
        for path, body in [
            ("/tokenize", {"content": "x"}),
            ("/detokenize", {"tokens": [1]}),
            ("/v1/embeddings", {"input": "x"}),
        ]:
            assert httpx.post(s.url + path, json=body).status_code == 401
            assert httpx.post(
                s.url + path, json=body, headers={"Authorization": "Bearer k"}
            ).status_code in (200, 400)
