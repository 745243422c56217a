"""A small tool-using agent: the model calls two Python tools, turn after turn.

    python examples/agent.py                          # the goinfer library, smollm2-135m
    python examples/agent.py path/to/model.gguf       # another model
    python examples/agent.py --server http://127.0.0.1:8000/v1 [--model NAME]
                                                      # any OpenAI-compatible endpoint

Each user turn runs the agent loop: the model must call a tool first (tool_choice
"required": the call is constrained, so even a 135M model writes one whose arguments fit the
tool's schema; parallel_tool_calls false, as a small model allowed several calls tends to
repeat its call until max_tokens), the tool runs here in Python, its result goes back as a
"tool" message, and the model answers (tool_choice "none").  The whole conversation is sent
again every step, as agents do; the tools stay in the prompt whatever tool_choice is, so the
prompt only grows and the cached prefix is reused: each step prints how many prompt tokens
came from the cache.
"""

from __future__ import annotations

import argparse
import json

# ---------------------------------------------------------------------------- the tools

WEATHER = {"paris": (18, "sunny"), "tokyo": (24, "cloudy"), "london": (12, "rain")}


def get_weather(city: str) -> dict:
    temp, sky = WEATHER.get(city.strip().lower(), (20, "clear"))
    return {"city": city, "temperature_c": temp, "sky": sky}


def add(a: float, b: float) -> dict:
    return {"sum": a + b}


FUNCTIONS = {"get_weather": get_weather, "add": add}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
QUESTIONS = ["What is the weather in Paris?", "And in Tokyo?", "What is 12.5 plus 30?"]


def run_tool(call: dict) -> str:
    fn = FUNCTIONS.get(call["function"]["name"])
    try:
        args = json.loads(call["function"]["arguments"])
        return json.dumps(fn(**args)) if fn else json.dumps({"error": "no such tool"})
    except (ValueError, TypeError) as e:  # a model may still pick odd values
        return json.dumps({"error": str(e)})


# ---------------------------------------------------------------------------- two backends


def library_backend(model_name: str, max_tokens: int):
    import goinfer

    model = goinfer.Model.load(model_name, progress=False)
    session = model.session()
    print(f"model: {model.name} (goinfer library)")

    def step(messages, tool_choice):
        r = session.chat(
            messages,
            max_tokens=max_tokens,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            temperature=0.0,
        )
        return r.message(), r.prompt_tokens, r.cached_tokens

    return step


def server_backend(url: str, model_name: str | None, max_tokens: int):
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    model_name = model_name or client.models.list().data[0].id
    print(f"model: {model_name} at {url}")

    def step(messages, tool_choice):
        r = client.chat.completions.create(
            model=model_name,
            messages=messages,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=max_tokens,
            temperature=0,
        )
        m = r.choices[0].message.model_dump(exclude_none=True)
        details = r.usage.prompt_tokens_details
        return m, r.usage.prompt_tokens, (details.cached_tokens or 0) if details else 0

    return step


# ---------------------------------------------------------------------------- the loop


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--server", help="base URL of an OpenAI-compatible API (ends in /v1)")
    ap.add_argument("--model", dest="server_model", help="model name to ask the server for")
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args(argv)
    step = (
        server_backend(a.server, a.server_model, a.max_tokens)
        if a.server
        else library_backend(a.model, a.max_tokens)
    )

    messages = [{"role": "system", "content": "You are a helpful assistant. Use the tools."}]
    for question in QUESTIONS:
        print(f"\nuser: {question}")
        messages.append({"role": "user", "content": question})
        for tool_choice in ("required", "none"):  # call a tool, then answer with its result
            reply, prompt_tokens, cached = step(messages, tool_choice)
            messages.append(reply)
            print(f"  [{prompt_tokens} prompt tokens, {cached} from cache]")
            for call in reply.get("tool_calls") or []:
                result = run_tool(call)
                print(
                    f"  tool call: {call['function']['name']}({call['function']['arguments']})"
                    f" -> {result}"
                )
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            if not reply.get("tool_calls"):
                print(f"assistant: {(reply.get('content') or '').strip()}")
                break


if __name__ == "__main__":
    main()
