"""What every framework's tests share: the tool, the prompts, the structured-output types.

Tiny models are weak, so the tests take the constrained paths (a forced tool call, a schema the
server enforces), sample at temperature 0 and leave room (MAX_TOKENS) for a complete reply; the
framework's own parsing and validation is the check.
"""

from __future__ import annotations

import json

from pydantic import BaseModel

MAX_TOKENS = 160  # enough for any reply below; a reply that needs more is a runaway
TEMPERATURE = 0.0

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
WEATHER_QUESTION = "What is the weather in Paris right now?"


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: the city's name, e.g. Paris
    """
    return f"Sunny, 21 degrees Celsius in {city}."


# The same tool as an OpenAI function tool, written as a user would: `properties` and
# `required`, no `additionalProperties` (OpenAI and llama.cpp treat it as a closed object).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

EXTRACT_PROMPT = "Ada Lovelace was 36 years old. Extract the person's name and age."


class Person(BaseModel):
    name: str
    age: int


# For the modes that only prompt for JSON (response_format json_object, or none): a tiny model
# copies an example far more reliably than it follows a JSON schema.
JSON_INSTRUCTIONS = (
    'Reply with only a JSON object with the keys "name" (a string) and "age" '
    '(an integer), for example {"name": "Bob Smith", "age": 20}.'
)

LIST_PROMPT = "Ada Lovelace was 36 years old and Alan Turing was 41. Extract every person."


def check_person(p: object) -> None:
    """A Person the framework built (and validated) from the reply."""
    assert isinstance(p, Person), f"not a Person: {p!r}"
    assert p.name.strip(), f"empty name: {p!r}"


def json_args(arguments: str, declared: set[str]) -> dict:
    """A tool call's arguments: complete JSON, an object, no key the schema does not declare."""
    args = json.loads(arguments)
    assert isinstance(args, dict), f"arguments are not an object: {arguments!r}"
    extra = set(args) - declared
    assert not extra, f"undeclared argument keys {sorted(extra)} in {arguments!r}"
    return args
