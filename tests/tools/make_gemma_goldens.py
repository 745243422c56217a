"""Write tests/data/gemma3_270m_goldens.json: what transformers and llama.cpp compute on the real
Gemma 3 270M Q4_K_M GGUF, so CI can check goinfer against them without loading transformers'
GGUF path (its stock GGUF reader takes minutes over a 262k-token vocabulary).

Run with a Python that has torch, transformers, gguf and llama-cpp-python (not needed by CI):

    /tmp/peers-venv/bin/python tests/tools/make_gemma_goldens.py [PATH.gguf]

Stored:
- ``ids``: llama.cpp's tokens of tests/data/agreement_text.txt with BOS (add_bos=True), one
  window of up to 1024 tokens (longer than the model's 512-token sliding window);
- ``hf_top1`` / ``hf_margin``: transformers' (float32, weights dequantized from the GGUF by its
  own loader) teacher-forced argmax at every position and the logit gap to its second choice;
- ``llama_cpp_top1``: llama.cpp's argmax at the same positions (for the record);
- ``hf_norms``: a few norm vectors as transformers loads them (it subtracts the 1 that llama.cpp's
  converter adds), to pin how goinfer reads Gemma's norm weights;
- ``chats``: conversations, llama.cpp's prompt tokens (built-in gemma template text tokenized with
  add_bos=True) and llama.cpp's greedy reply.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import date

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
TEXT = os.path.join(DATA, "agreement_text.txt")
OUT = os.path.join(DATA, "gemma3_270m_goldens.json")
DEFAULT_GGUF = os.path.expanduser("~/.cache/goinfer/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf")
WINDOW = 1024

CHATS = [
    [
        {"role": "system", "content": "Answer with one word."},
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "What is the capital of Germany?"},
        {"role": "assistant", "content": "Berlin."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "The capital of Italy is Rome."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
]
NORMS = {  # GGUF tensor -> transformers parameter
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    "blk.0.attn_q_norm.weight": "model.layers.0.self_attn.q_norm.weight",
    "blk.5.post_ffw_norm.weight": "model.layers.5.post_feedforward_layernorm.weight",
    "output_norm.weight": "model.norm.weight",
}


def render_gemma(messages) -> str:
    """llama.cpp's built-in "gemma" chat template (no Jinja, no goinfer code involved)."""
    import ctypes

    import llama_cpp

    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(messages), True, buf, len(buf))
    return buf.raw[:n].decode()


def main() -> None:
    import llama_cpp
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    text = open(TEXT, encoding="utf-8").read()
    llm = llama_cpp.Llama(
        path, n_ctx=WINDOW, n_batch=WINDOW, logits_all=True, n_threads=2, verbose=False
    )
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)[:WINDOW]
    llm.eval(ids)
    ll_top1 = np.array(llm.scores[: len(ids)], dtype=np.float32).argmax(1)

    chats = []
    for messages in CHATS:
        prompt = render_gemma(messages)
        pids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
        llm.reset()
        out = llm.create_completion(pids, max_tokens=16, temperature=0.0)
        chats.append(
            {
                "messages": messages,
                "prompt": prompt,
                "llama_cpp_ids": pids,
                "llama_cpp_reply": out["choices"][0]["text"],
            }
        )
    del llm

    torch.set_num_threads(2)
    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    top2 = np.sort(ref, axis=1)[:, -2:]
    sd = hf.state_dict()
    res = {
        "made_by": "tests/tools/make_gemma_goldens.py",
        "date": date.today().isoformat(),
        "gguf": os.path.basename(path),
        "llama_cpp_python_version": llama_cpp.__version__,
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "ids": [int(t) for t in ids],
        "hf_top1": [int(t) for t in ref.argmax(1)],
        "hf_margin": [round(float(m), 5) for m in (top2[:, 1] - top2[:, 0])],
        "llama_cpp_top1": [int(t) for t in ll_top1],
        "hf_norms": {g: [float(v) for v in sd[h].float().numpy()[:16]] for g, h in NORMS.items()},
        "chats": chats,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=False)
        f.write("\n")
    agree = float((ll_top1 == ref.argmax(1)).mean())
    print(
        f"wrote {OUT}: {len(ids)} positions, llama.cpp top-1 agreement with transformers {agree:.4f}"
    )


if __name__ == "__main__":
    main()
