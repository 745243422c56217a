"""Write tests/data/smollm2_fast_goldens.npz: SmolLM2-135M-Instruct (the Q4_1 GGUF that
goinfer.hub registers as "smollm2-135m") run by Hugging Face transformers with the GGUF's
weights dequantized to float32, on two prompts cut from tests/data/tokenizer_corpus.txt:

  long   1000 tokens (above goinfer's 512-token fast-attention floor: the default fast path)
  short   300 tokens (below it: the exact path)

For each: the token ids, the last position's logits (float16: the tests compare by cosine and
argmax) and the teacher-forced argmax of every position.  Run by hand (the output is
committed; tests never run this):

    PYTHONPATH=. python tests/tools/make_fast_goldens.py

transformers and the tokenizer are the references: goinfer only locates the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from goinfer import hub

DATA = Path(__file__).resolve().parents[1] / "data"
PROMPTS = {"long": (0, 1000), "short": (5000, 5300)}  # token ranges of the corpus


def main() -> None:
    path = hub.resolve("smollm2-135m", progress=False)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    ).eval()
    ids_all = tok((DATA / "tokenizer_corpus.txt").read_text(), add_special_tokens=False)[
        "input_ids"
    ]
    out = {
        "transformers_version": np.array(transformers.__version__),
        "torch_version": np.array(torch.__version__),
        "gguf_file": np.array(path.name),
    }
    for name, (a, b) in PROMPTS.items():
        ids = ids_all[a:b]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()  # (T, vocab)
        out[f"{name}_ids"] = np.asarray(ids, np.int32)
        out[f"{name}_last_logits"] = logits[-1].astype(np.float16)
        out[f"{name}_top1"] = logits.argmax(1).astype(np.int32)
        print(name, len(ids), "last argmax", int(logits[-1].argmax()))
    np.savez_compressed(DATA / "smollm2_fast_goldens.npz", **out)
    print("wrote", DATA / "smollm2_fast_goldens.npz")


if __name__ == "__main__":
    main()
