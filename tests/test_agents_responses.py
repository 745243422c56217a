"""Agent clients on /v1/responses with real models: the OpenAI Agents SDK (an Agent with two
function tools on its default Responses model, run to a final answer, plain and streamed), the
official client's structured output on SmolLM2, and the Codex CLI itself (``codex exec`` and
``codex exec resume --last`` against Gemma 3 270M: exit 0 with the model's reply, a
function-call round trip through Codex, and the resumed session's prompt served from the
prefix cache)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time

import httpx
import openai
import pydantic
import pytest
from test_server import Server

from goinfer import KVCache, hub
from goinfer.model import Model
from goinfer.server.openai_responses import Responses
from goinfer.server.routes import ROUTES

pytestmark = pytest.mark.slow


def _model(name: str) -> Model:
    return Model.load(str(hub.resolve(name, progress=False)), threads=1, progress=False)


@pytest.fixture(scope="module")
def smol():
    m = _model("smollm2-135m")
    with Server(m, KVCache(m, max_tokens=8192)) as s:
        yield s


# ============================================================================ openai SDK


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population_millions: float = pydantic.Field(ge=0, le=50)


def test_structured_output_on_a_real_model(smol):
    c = smol.client()
    r = c.responses.parse(
        model="smollm2-135m",
        text_format=City,
        max_output_tokens=120,
        input="Describe Paris as JSON (name, country, population).",
        temperature=0,
    )
    assert r.status == "completed" and isinstance(r.output_parsed, City)
    with c.responses.stream(
        model="smollm2-135m",
        text_format=City,
        max_output_tokens=120,
        input="Describe Paris as JSON (name, country, population).",
        temperature=0,
    ) as st:
        streamed = st.get_final_response()
    assert streamed.output_parsed == r.output_parsed


# ============================================================================ Agents SDK


def _agent_run(url: str, streamed: bool):
    import agents
    from agents import Agent, ModelSettings, Runner, function_tool

    agents.set_tracing_disabled(True)  # it would send traces to OpenAI
    agents.set_default_openai_client(
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0), use_for_tracing=False
    )
    agents.set_default_openai_api("responses")
    calls: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(("get_weather", city))
        return f"It is sunny and 21 C in {city}."

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        calls.append(("get_time", city))
        return f"It is 10:00 in {city}."

    # a 135M model does not call a tool by itself: the first turn forces get_weather; the
    # Agent then resets tool_choice (its default), so the next turn answers
    agent = Agent(
        name="assistant",
        instructions="Answer with the tools' results.",
        tools=[get_weather, get_time],
        model="smollm2-135m",
        model_settings=ModelSettings(
            tool_choice="get_weather", temperature=0, max_tokens=60, parallel_tool_calls=False
        ),
    )
    question = "What is the weather in Paris?"
    if not streamed:
        return Runner.run_sync(agent, question, max_turns=4), calls

    async def go():
        run = Runner.run_streamed(agent, question, max_turns=4)
        kinds = [ev.type async for ev in run.stream_events()]
        return run, kinds

    run, kinds = asyncio.run(go())
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    return run, calls


@pytest.mark.parametrize("streamed", [False, True])
def test_agents_sdk_runs_tools_to_a_final_answer(smol, streamed):
    t0 = time.time()
    result, calls = _agent_run(smol.url, streamed)
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert kinds[-1] == "message_output_item"
    assert calls and calls[0][0] == "get_weather" and isinstance(calls[0][1], str)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    # the second request continued the first: the first prompt came from the cache
    usages = [r.usage for r in result.raw_responses]
    assert len(usages) >= 2 and usages[1].input_tokens_details.cached_tokens > 0
    print(f"agents run ({'streamed' if streamed else 'plain'}): {time.time() - t0:.1f} s")


# ============================================================================ Codex CLI


class Scripted(Responses):
    """The Responses route with tool_choice set per request, and a record of what it served.
    Codex sends tool_choice "auto" and no way to change it; a 270M model given Codex's 17k
    characters of tools calls them over and over.  The script forces one call (get_goal, which
    takes no arguments, so Codex runs nothing the model made up), then no calls: the answer,
    held to the --output-schema Codex sends."""

    def __init__(self, choices):
        self.choices = list(choices)
        self.bodies: list[dict] = []
        self.replies: list[dict] = []

    def parse(self, body, vocab_size):
        req = super().parse(body, vocab_size)
        self.bodies.append(body)
        req.tool_choice = self.choices.pop(0) if self.choices else "none"
        return req

    def finished(self, resp, req, result):
        self.replies.append(resp)
        super().finished(resp, req, result)


def _codex(url: str, home, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    import codex_cli_bin

    provider = [
        "-c",
        "model_provider=goinfer",
        "-c",
        "model_providers.goinfer.name=goinfer",
        "-c",
        f"model_providers.goinfer.base_url={url}/v1",
        "-c",
        "model_providers.goinfer.wire_api=responses",
        "-c",
        "model_providers.goinfer.env_key=GOINFER_API_KEY",
        "-c",
        "model=gemma3-270m",
    ]
    work = home / "work"
    work.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TERM": "dumb",
        "GOINFER_API_KEY": "local",
        "RUST_LOG": "error",
    }
    (home / ".codex").mkdir(exist_ok=True)
    return subprocess.run(
        [str(codex_cli_bin.bundled_codex_path()), *provider, *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


GREETING = {
    "type": "object",
    "properties": {"greeting": {"type": "string", "enum": ["hello", "hi", "hey"]}},
    "required": ["greeting"],
    "additionalProperties": False,
}


def _answer(resp: dict) -> str:
    return "".join(
        p["text"] for o in resp["output"] if o["type"] == "message" for p in o["content"]
    )


def test_codex_exec_and_resume_on_gemma(tmp_path):
    m = _model("gemma3-270m")
    route = Scripted([{"type": "function", "function": {"name": "get_goal"}}])
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(GREETING))
    routes = tuple(r for r in ROUTES if r.path != route.path) + (route,)
    with Server(m, KVCache(m, max_tokens=32768), routes=routes) as s:
        t0 = time.time()
        first = _codex(
            s.url,
            tmp_path,
            "exec",
            "--skip-git-repo-check",
            "--output-schema",
            str(schema),
            "Greet me.",
        )
        t1 = time.time()
        assert first.returncode == 0, first.stderr[-2000:]
        n_first = len(route.replies)
        # the forced call went to Codex, which ran get_goal and sent its output back
        assert route.replies[0]["output"][-1]["name"] == "get_goal"
        call_id = route.replies[0]["output"][-1]["call_id"]
        outputs = [i for i in route.bodies[1]["input"] if i.get("type") == "function_call_output"]
        assert [o["call_id"] for o in outputs] == [call_id]
        answer = _answer(route.replies[n_first - 1])
        assert json.loads(answer)["greeting"] in ("hello", "hi", "hey")
        assert answer in first.stdout
        resumed = _codex(
            s.url,
            tmp_path,
            "exec",
            "--skip-git-repo-check",
            "--output-schema",
            str(schema),
            "resume",
            "--last",
            "Greet me again.",
        )
        t2 = time.time()
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        last = route.replies[-1]
        assert len(route.replies) > n_first and _answer(last) in resumed.stdout
        u = last["usage"]
        assert u["input_tokens_details"]["cached_tokens"] >= 0.95 * u["input_tokens"], u
        # one session: one prompt_cache_key, the same tools every turn, nothing left but the
        # hosted web search
        keys = {b["prompt_cache_key"] for b in route.bodies}
        assert len(keys) == 1
        assert all(b["tools"] == route.bodies[0]["tools"] for b in route.bodies)
        assert route.replies[0]["tools_left_out"] == ["web_search"]
        metrics = httpx.get(s.url + "/metrics", timeout=30).text
        statuses = re.findall(
            r'goinfer_http_requests_total\{route="/v1/responses",'
            r'code="(\d+)"\} (\d+)',
            metrics,
        )
        assert re.search(
            rf'goinfer_cache_key_requests_total\{{key="{keys.pop()}"\}} '
            rf"{len(route.bodies)}",
            metrics,
        )
    # the transcript: each request Codex sent, and what it got
    for i, (b, r) in enumerate(zip(route.bodies, route.replies)):
        u = r["usage"]
        print(
            f"{'exec' if i < n_first else 'resume'} #{i + 1}: {len(b['input'])} input items "
            f"-> {r['status']}, {[o['type'] for o in r['output']]}, {u['input_tokens']} "
            f"prompt tokens, {u['input_tokens_details']['cached_tokens']} cached"
        )
    print(f"HTTP statuses of POST /v1/responses: {dict(statuses)}")
    print(
        f"codex exec: {t1 - t0:.1f} s ({n_first} requests), resume: {t2 - t1:.1f} s "
        f"({len(route.replies) - n_first} requests); resumed prompt {u['input_tokens']} "
        f"tokens, {u['input_tokens_details']['cached_tokens']} cached"
    )
