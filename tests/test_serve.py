"""``needle-cy serve`` on a loopback port, driven by the real ``openai`` and ``ollama``
clients: tool calls over the smart-home catalogue, streamed and not, a two-turn
conversation with a tool result (resumed, and put in turn by turn), ``tool_choice``
none / required / named, a refusal, the error cases in each convention's shape, a full
queue, a client that disconnects, and the CLI.

Every call must be valid against its tool's schema and equal to what ``Needle.complete``
gives for the same conversation (an agent in this process, on its own copy of the model).
"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import importlib

import pytest


def _need(module):
    """The module, from the test extra; a loud skip without it, a failure under CI."""
    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip("LOUD SKIP: " + message, allow_module_level=True)


httpx, openai, ollama, uvicorn, jsonschema, _ = map(_need, ("httpx", "openai", "ollama", "uvicorn",
                                                            "jsonschema", "starlette"))

from conftest import REPO  # noqa: E402
from needle_cy import Needle, home_tools  # noqa: E402
from needle_cy.serve.app import bind, create_app, is_loopback  # noqa: E402
from needle_cy.serve.engine import Engine  # noqa: E402
from needle_cy.serve.protocol import OLLAMA, OPENAI, RequestError, parse_chat  # noqa: E402
from needle_cy.toolspec import normalize_tool  # noqa: E402

KEY = "test-key-4d9c"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPENAI_TOOLS = [{"type": "function", "function": t} for t in home_tools()]
# what the ollama client sends: it rebuilds each tool with its own model (which keeps
# only type, description, enum and items of each property)
OLLAMA_TOOLS = [ollama.Tool.model_validate(t).model_dump(exclude_none=True)["function"]
                for t in OPENAI_TOOLS]
RESULT = {"ok": True}


class ServerThread:
    """uvicorn serving ``create_app(engine)`` on a free loopback port, in a thread."""

    def __init__(self, engine, **app_kwargs):
        self.engine = engine
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(engine, **app_kwargs), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        # one HTTP client for the test's own requests (making one per request costs ~0.2 s)
        self.http = httpx.Client(base_url=self.url, timeout=60)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.engine.close()
        self.sock.close()
        self.http.close()

    def health(self, headers=None):
        return self.http.get("/health", headers=headers or {}).json()


@pytest.fixture(scope="module")
def server():
    engine = Engine(threads=1, max_queue=4)
    with ServerThread(engine, api_key=KEY, max_body_bytes=256 * 1024) as running:
        yield running


@pytest.fixture(scope="module")
def oracle():
    """Needle.complete on the same catalogue (its own model copy, one thread as the server)."""
    return Needle(tools=home_tools(), threads=1)


@pytest.fixture(scope="module")
def ollama_oracle(oracle):
    return Needle(oracle.model, tools=OLLAMA_TOOLS, tokenizer=oracle.tokenizer)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def ollama_client(server):
    return ollama.Client(host=server.url, headers=AUTH, timeout=60)


def expected(agent, *turns, history=(), **kwargs):
    """The calls ``Needle.complete`` gives for the last of ``turns`` after the others
    (and after ``history``, finished turns put in with ``add_turn``)."""
    agent.reset()
    for text, calls in history:
        agent.add_turn(text, calls)
    for text in turns[:-1]:
        agent.complete(text)
    r = agent.complete(turns[-1], **kwargs)
    forced = "require_call" in kwargs or "require_tool" in kwargs
    return r["function_calls"] + (r["suppressed_calls"] if forced else [])


def openai_calls(message):
    return [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
            for c in message.tool_calls or []]


def ollama_calls(message):
    return [{"name": c.function.name, "arguments": dict(c.function.arguments)}
            for c in message.tool_calls or []]


def assert_schema_valid(calls, tools):
    by_name = {t["name"]: t for t in tools}
    for call in calls:
        assert call["name"] in by_name, call
        params = normalize_tool(by_name[call["name"]]).grammar_schema()["parameters"]
        jsonschema.validate(call["arguments"], params)


def chat(client, messages, **kwargs):
    kwargs.setdefault("tools", OPENAI_TOOLS)
    return client.chat.completions.create(model="needle-cy", messages=messages, **kwargs)


def user(text):
    return [{"role": "user", "content": text}]


def streamed(client, messages, **kwargs):
    """(calls, finish_reason, usage) of a streamed request, the deltas put together as
    a client does."""
    parts, finish, usage = {}, None, None
    for chunk in chat(client, messages, stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                part = parts.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.function.name:
                    part["name"] += delta.function.name
                part["arguments"] += delta.function.arguments or ""
    calls = [{"name": p["name"], "arguments": json.loads(p["arguments"])} for _, p in sorted(parts.items())]
    return calls, finish, usage


# ------------------------------------------------------------------ OpenAI

QUERIES = ["turn on the kitchen light", "set the thermostat to 21 degrees",
           "turn off the bedroom light and lock the back door"]


@pytest.mark.parametrize("query", QUERIES)
def test_openai_tool_calls_are_those_of_needle_complete(client, oracle, query):
    r = chat(client, user(query))
    message, choice = r.choices[0].message, r.choices[0]
    calls = openai_calls(message)
    assert calls == expected(oracle, query) and calls
    assert_schema_valid(calls, home_tools())
    assert choice.finish_reason == "tool_calls" and message.content is None
    assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls)
    assert len({c.id for c in message.tool_calls}) == len(calls)
    assert r.model == "needle-cy" and r.object == "chat.completion"
    assert 0 < r.usage.completion_tokens and r.usage.prompt_tokens > len(query.split())
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.parametrize("query", QUERIES[1:])
def test_openai_streamed_calls_are_the_same(client, oracle, query):
    calls, finish, usage = streamed(client, user(query))
    assert calls == expected(oracle, query) and calls
    assert finish == "tool_calls"
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_the_event_stream_is_server_sent_events_ending_with_done(server):
    body = {"model": "needle-cy", "stream": True, "tools": OPENAI_TOOLS,
            "messages": user("set the thermostat to 21 degrees")}
    with server.http.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_second_turn_resumes_the_first_and_matches_needle(client, oracle):
    query = "set the thermostat to 21 degrees"
    messages = user(query)
    first = chat(client, messages)
    assert openai_calls(first.choices[0].message) == expected(oracle, query)
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    messages = messages + [assistant] + [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps(RESULT)}
        for c in first.choices[0].message.tool_calls]
    second = chat(client, messages)
    calls = openai_calls(second.choices[0].message)
    assert calls == expected(oracle, query, [RESULT] * len(first.choices[0].message.tool_calls))
    assert_schema_valid(calls, home_tools())
    # the whole first turn came from the server's conversation cache: only the tool
    # result turn was prefilled
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.total_tokens
    assert second.usage.prompt_tokens > first.usage.total_tokens
    # streamed, the same request gives the same calls
    assert streamed(client, messages)[0] == calls


def test_a_history_the_server_has_not_seen_is_put_in_turn_by_turn(client, oracle):
    query = "lock the front door"
    made_up = [{"name": "lock_door", "arguments": {"door": "back door"}}]
    messages = user(query) + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lock_door", "arguments": '{"door": "back door"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(RESULT)}]
    r = chat(client, messages)
    calls = openai_calls(r.choices[0].message)
    assert calls == expected(oracle, [RESULT], history=[(query, made_up)])
    assert_schema_valid(calls, home_tools())
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_a_refusal_is_an_assistant_message_without_calls(client, oracle):
    assert expected(oracle, "hello there") == []
    r = chat(client, user("hello there"))
    message = r.choices[0].message
    assert message.role == "assistant" and not message.tool_calls and message.content == ""
    assert r.choices[0].finish_reason == "stop"
    calls, finish, _ = streamed(client, user("hello there"))
    assert calls == [] and finish == "stop"


def test_tool_choice_none_required_and_named(client, oracle):
    query = "hello there"
    none = chat(client, user("turn on the kitchen light"), tool_choice="none")
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason == "stop"

    required = openai_calls(chat(client, user(query), tool_choice="required").choices[0].message)
    assert required and required == expected(oracle, query, require_call=True)
    assert_schema_valid(required, home_tools())

    for name, text in (("set_light", query), ("play_music", "turn on the kitchen light")):
        choice = {"type": "function", "function": {"name": name}}
        named = openai_calls(chat(client, user(text), tool_choice=choice).choices[0].message)
        assert named and {c["name"] for c in named} == {name}
        assert named == expected(oracle, text, require_tool=name)
        assert_schema_valid(named, home_tools())
        assert streamed(client, user(text), tool_choice=choice)[0] == named


def test_parallel_tool_calls_false_allows_one_call(client, oracle):
    query = "turn off the bedroom light and lock the back door"
    one = Needle(oracle.model, tools=home_tools(), tokenizer=oracle.tokenizer, max_calls_per_turn=1)
    r = chat(client, user(query), parallel_tool_calls=False, tool_choice="required")
    calls = openai_calls(r.choices[0].message)
    assert len(calls) == 1 and calls == expected(one, query, require_call=True)
    assert len(expected(oracle, query)) == 2          # two calls when several are allowed


def test_max_tokens_too_small_for_a_call_finishes_with_length(client):
    r = chat(client, user("turn off the bedroom light and lock the back door"), max_tokens=3)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls


# ------------------------------------------------------------------ Ollama

@pytest.mark.parametrize("query", QUERIES[1:])
def test_ollama_chat_calls_are_those_of_needle_complete(ollama_client, ollama_oracle, query):
    want = expected(ollama_oracle, query)
    r = ollama_client.chat(model="needle-cy", messages=user(query), tools=OPENAI_TOOLS, stream=False)
    assert r.done and r.done_reason == "stop" and r.message.role == "assistant"
    assert ollama_calls(r.message) == want and want
    assert_schema_valid(want, OLLAMA_TOOLS)
    assert r.prompt_eval_count > 0 and r.eval_count > 0 and r.total_duration > 0
    # streamed as NDJSON: the calls in one piece, then the closing one with the counters
    pieces = list(ollama_client.chat(model="needle-cy:latest", messages=user(query),
                                     tools=OPENAI_TOOLS, stream=True))
    assert pieces[-1].done and not any(p.done for p in pieces[:-1])
    assert [c for p in pieces for c in ollama_calls(p.message)] == want


def test_ollama_two_turn_conversation_and_refusal(ollama_client, ollama_oracle):
    query = "set a timer for ten minutes"
    first = ollama_client.chat(model="needle-cy", messages=user(query), tools=OPENAI_TOOLS, stream=False)
    assert ollama_calls(first.message) == expected(ollama_oracle, query)
    messages = user(query) + [first.message] + [
        {"role": "tool", "content": json.dumps(RESULT), "tool_name": c.function.name}
        for c in first.message.tool_calls]
    second = ollama_client.chat(model="needle-cy", messages=messages, tools=OPENAI_TOOLS, stream=False)
    want = expected(ollama_oracle, query, [RESULT] * len(first.message.tool_calls))
    assert ollama_calls(second.message) == want
    assert_schema_valid(want, OLLAMA_TOOLS)
    refusal = ollama_client.chat(model="needle-cy", messages=user("hello there"), tools=OPENAI_TOOLS,
                                 stream=False)
    assert refusal.message.content == "" and not refusal.message.tool_calls and refusal.done


# Tools shaped as Home Assistant's Ollama integration sends its intent tools
HA_TOOLS = [
    {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": []}}}
    for name, description, properties in (
        ("HassTurnOn", "Turns on/opens/presses a device or entity",
         {"name": {"type": "string"}, "area": {"type": "string"}, "floor": {"type": "string"},
          "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch", "fan", "cover"]}}}),
        ("HassTurnOff", "Turns off/closes a device or entity",
         {"name": {"type": "string"}, "area": {"type": "string"},
          "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch", "fan", "cover"]}}}),
        ("HassLightSet", "Sets the brightness percentage or color of a light",
         {"name": {"type": "string"}, "area": {"type": "string"}, "color": {"type": "string"},
          "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}),
        ("GetLiveContext", "Provides real-time information about the devices", {}))]


def test_a_home_assistant_style_exchange(server, oracle):
    """What Home Assistant's Ollama integration sends: the async client, streaming, with
    keep_alive, num_ctx, think and format, a system prompt, its tools, and the tool result
    as {"data", "error"}; the answer is Needle's for the same conversation."""
    import asyncio
    sent_tools = [ollama.Tool.model_validate(t).model_dump(exclude_none=True)["function"] for t in HA_TOOLS]
    system = "date: 2026-03-04"
    needle = Needle(oracle.model, tools=sent_tools, tokenizer=oracle.tokenizer, system=system)
    query = "turn on the kitchen light"
    result = {"data": {"success": [{"name": "Kitchen light", "type": "entity"}], "failed": []}, "error": None}

    made_up = [{"name": "HassTurnOn", "arguments": {"name": "kitchen light"}}]

    async def request(client, messages):
        calls, last = [], None
        async for piece in await client.chat(model="needle-cy:latest", messages=messages, tools=HA_TOOLS,
                                             stream=True, keep_alive=-1, options={"num_ctx": 8192},
                                             think=None, format=None):
            calls += ollama_calls(piece.message)
            last = piece
        assert last.done and last.done_reason == "stop"
        return calls

    async def converse():
        client = ollama.AsyncClient(host=server.url, headers=AUTH, timeout=60)
        messages = [ollama.Message(role="system", content=system), ollama.Message(role="user", content=query)]
        first = await request(client, list(messages))
        # the next request as Home Assistant sends it after running a call
        messages.append(ollama.Message(role="assistant", content="", thinking=None, tool_calls=[
            ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(**c)) for c in made_up]))
        messages.append(ollama.Message(role="tool", content=json.dumps(result)))
        return first, await request(client, messages)

    first, second = asyncio.run(converse())
    assert first == expected(needle, query)
    assert second == expected(needle, [result], history=[(query, made_up)])
    assert_schema_valid(first + second, sent_tools)


def test_a_system_prompt_too_long_for_the_context_says_how_to_leave_it_out(server):
    r = post(server, "/api/chat", body={"model": "needle-cy", "stream": False, "tools": OPENAI_TOOLS,
                                        "messages": [{"role": "system", "content": "You are helpful. " * 400}]
                                        + user("turn on the kitchen light")})
    assert r.status_code == 400
    assert "--ignore-system" in error_of(r, OLLAMA) and "context" in error_of(r, OLLAMA)


def test_listing_endpoints_name_the_model(server, client, ollama_client):
    assert [m.id for m in client.models.list()] == ["needle-cy"]
    assert client.models.retrieve("needle-cy").id == "needle-cy"
    listed = ollama_client.list()
    assert [m.model for m in listed.models] == ["needle-cy:latest"]
    assert listed.models[0].size > 0 and listed.models[0].details.format == "cact"
    assert [m.model for m in ollama_client.ps().models] == ["needle-cy:latest"]
    assert "tools" in ollama_client.show("needle-cy").capabilities
    assert ollama_client.pull("needle-cy").status == "success"
    version = server.http.get("/api/version", headers=AUTH).json()["version"]
    import needle_cy
    assert version == needle_cy.__version__
    assert server.http.get("/").status_code == 200      # liveness needs no key
    status = server.health(AUTH)
    assert status["model"] == "needle-cy" and status["served"] > 0


# ------------------------------------------------------------------ faults

def post(server, path, body=None, content=None, headers=AUTH):
    return server.http.post(path, json=body, content=content, headers=headers)


def error_of(response, flavor):
    body = response.json()
    if flavor == OPENAI:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        return body["error"]["message"]
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


BAD_SCHEMA_TOOL = {"type": "function", "function": {
    "name": "set_code", "description": "Set the door code",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?=1)\\d+"}}}}}

FAULTS = {
    # name: (body or raw bytes, status, words the message holds)
    "too large": (b'{"model": "needle-cy", "messages": [], "pad": "' + b"x" * 300_000 + b'"}', 413,
                  ["limit"]),
    "malformed JSON": (b'{"model": "needle-cy", "messages": [', 400, ["not valid JSON"]),
    "unknown model": ({"model": "gpt-4o", "messages": user("hi")}, 404, ["gpt-4o", "needle-cy"]),
    "unsupported schema": ({"model": "needle-cy", "messages": user("set the code to 1234"),
                            "tools": [BAD_SCHEMA_TOOL]}, 400, ["set_code", "#/properties/code/pattern"]),
    "empty messages": ({"model": "needle-cy", "messages": []}, 400, ["messages", "empty"]),
    "no user message": ({"model": "needle-cy", "messages": [{"role": "system", "content": "x"}]}, 400,
                        ["no user message"]),
    "ends with the assistant": ({"model": "needle-cy", "messages": user("hi") + [
        {"role": "assistant", "content": "hello"}]}, 400, ["last message"]),
    "bad tool_choice": ({"model": "needle-cy", "messages": user("hi"), "tools": OPENAI_TOOLS,
                         "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, ["nope"]),
}


@pytest.mark.parametrize("flavor, path", [(OPENAI, "/v1/chat/completions"), (OLLAMA, "/api/chat")])
def test_each_fault_gets_its_status_and_shape_and_the_server_keeps_serving(server, flavor, path):
    for fault, (body, status, words) in sorted(FAULTS.items()):
        if fault == "bad tool_choice" and flavor == OLLAMA:
            continue                              # Ollama's chat has no tool_choice
        if isinstance(body, bytes):
            r = post(server, path, content=body, headers={**AUTH, "Content-Type": "application/json"})
        else:
            r = post(server, path, body=dict(body, stream=False))
        assert r.status_code == status, (fault, r.text)
        message = error_of(r, flavor)
        for word in words:
            assert word in message, (fault, message)
    unauthorized = post(server, path, body={"model": "needle-cy", "messages": user("hi")}, headers={})
    assert unauthorized.status_code == 401 and "API key" in error_of(unauthorized, flavor)
    # and the next request is served
    ok = post(server, path, body={"model": "needle-cy", "stream": False, "tools": OPENAI_TOOLS,
                                  "messages": user("set the thermostat to 21 degrees")})
    assert ok.status_code == 200, ok.text


def test_a_streamed_request_that_fails_gets_a_status_code_too(server):
    for path in ("/v1/chat/completions", "/api/chat"):
        r = post(server, path, body={"model": "needle-cy", "stream": True, "messages": user("set the code"),
                                     "tools": [BAD_SCHEMA_TOOL]})
        assert r.status_code == 400 and "set_code" in r.text


def test_the_sdks_raise_their_own_errors(client, ollama_client, server):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=user("hi"))
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, user("set the code to 1234"), tools=[BAD_SCHEMA_TOOL])
    assert "set_code" in str(info.value) and info.value.param == "tools"
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, [])
    assert info.value.param == "messages" and "empty" in str(info.value)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(ollama.ResponseError) as info:
        ollama_client.chat(model="llama3", messages=user("hi"))
    assert info.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as info:
        ollama_client.chat(model="needle-cy", messages=[], tools=OPENAI_TOOLS)
    assert info.value.status_code == 400 and "empty" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=server.url).list()            # no key
    assert info.value.status_code == 401


class SlowModel:
    """The embedded model with every decode step delayed by ``delay`` seconds (changed as
    the test goes), so that a turn lasts long enough to queue behind and to walk away from."""

    def __init__(self, model, delay):
        self._model, self.delay = model, delay

    def step(self, token):
        time.sleep(self.delay)
        return self._model.step(token)

    def __getattr__(self, name):
        return getattr(self._model, name)


def _open(port, path, body):
    """A request sent on a raw socket, so that the test can hang up at any moment."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _wait_for(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_full_queue_answers_503_and_a_client_that_leaves_is_cancelled(oracle):
    model = SlowModel(oracle.model, 0.02)
    engine = Engine(model, tokenizer=oracle.tokenizer, name="needle-cy", max_queue=1)
    long_query = "turn off the bedroom light and lock the back door"
    body = {"model": "needle-cy", "stream": True, "tools": OPENAI_TOOLS, "messages": user(long_query)}
    with ServerThread(engine) as slow:
        running = _open(slow.port, "/v1/chat/completions", body)
        received = b""
        while b"data:" not in received:          # the turn has begun: the stream started
            ready, _, _ = select.select([running], [], [], 30)
            assert ready, "no stream"
            received += running.recv(4096)
        model.delay = 0.5                         # what is left of the turn now lasts seconds
        waiting = _open(slow.port, "/api/chat", dict(body, stream=False))
        _wait_for(lambda: slow.health()["queued"] == 1, "the second request to queue")
        for path, flavor in (("/v1/chat/completions", OPENAI), ("/api/chat", OLLAMA)):
            full = slow.http.post(path, json=dict(body, stream=False))
            assert full.status_code == 503 and int(full.headers["Retry-After"]) >= 1
            assert "busy" in error_of(full, flavor)
        waiting.close()                           # leaves while queued
        _wait_for(lambda: slow.health()["cancelled"] == 1 and slow.health()["queued"] == 0,
                  "the queued request to be dropped")
        running.close()                           # leaves during its turn
        _wait_for(lambda: slow.health()["cancelled"] == 2, "the running turn to be cancelled")
        model.delay = 0
        status = slow.health()
        assert status["served"] == 0 and status["rejected"] == 2 and not status["running"]
        # the engine goes on and gives Needle's calls
        short = "set the thermostat to 21 degrees"
        r = slow.http.post("/v1/chat/completions", json=dict(body, stream=False, messages=user(short)))
        calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                 for c in r.json()["choices"][0]["message"]["tool_calls"]]
        assert calls == expected(oracle, short)
        assert slow.health()["served"] == 1


# ------------------------------------------------------------------ the request mapping

def test_a_conversation_maps_onto_the_template_turns():
    messages = [
        {"role": "system", "content": "date: 2026-03-04"},
        {"role": "assistant", "content": "How can I help?"},            # a greeting: no turn
        {"role": "user", "content": "turn on the kitchen light"},
        {"role": "user", "content": [{"type": "text", "text": "and lock the door"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "set_light", "arguments": '{"on": true}'}},
            {"id": "b", "type": "function", "function": {"name": "lock_door", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": '{"ok": true}'},
        {"role": "tool", "tool_call_id": "b", "content": "locked"},
        {"role": "assistant", "content": "Done."},
        {"role": "developer", "content": "location: Paris"},
        {"role": "user", "content": "thanks"},
    ]
    req = parse_chat({"model": "m", "messages": messages, "tools": OPENAI_TOOLS[:2]}, OPENAI)
    assert req.system == "date: 2026-03-04\nlocation: Paris"
    assert [(t.text, t.is_results, t.calls) for t in req.history] == [
        ("turn on the kitchen light\nand lock the door", False,
         [{"name": "set_light", "arguments": {"on": True}}, {"name": "lock_door", "arguments": {}}]),
        ([{"ok": True}, "locked"], True, []),
    ]
    assert (req.final.text, req.final.is_results) == ("thanks", False)
    assert [t["name"] for t in req.tools] == ["set_light", "set_thermostat"]
    assert req.stream is False and req.tool_choice == "auto"
    # Ollama: arguments as objects, streaming unless told otherwise, num_predict
    req = parse_chat({"model": "m", "options": {"num_predict": 7}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "[1, 2]"}]}, OLLAMA)
    assert req.stream is True and req.max_tokens == 7
    assert req.history[0].calls == [{"name": "f", "arguments": {"x": 1}}]
    assert (req.final.text, req.final.is_results) == ([[1, 2]], True)


@pytest.mark.parametrize("messages, words", [
    ([{"role": "tool", "content": "1"}], "must follow an assistant message"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "1"}], "after a user message"),
    ([{"role": "wizard", "content": "a"}], "role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "only text"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]},
      {"role": "tool", "content": "1"}], "not valid JSON"),
    ("hello", "array"),
])
def test_a_malformed_conversation_is_named(messages, words):
    with pytest.raises(RequestError) as info:
        parse_chat({"model": "m", "messages": messages}, OPENAI)
    assert info.value.status == 400 and words in info.value.message and info.value.param == "messages"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                            ("0.0.0.0", False), ("192.168.1.5", False), ("::", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


# ------------------------------------------------------------------ the CLI

def test_cli_serve_listens_answers_and_stops_on_ctrl_c():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "needle_cy", "serve", "--port", "0", "--threads", "1",
                             "--name", "home"], stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "needle-cy serve:" not in line:
            assert proc.poll() is None and time.monotonic() < deadline, f"no start line: {line!r}"
            ready, _, _ = select.select([proc.stderr], [], [], 1)
            if ready:
                line = proc.stderr.readline()
        url = line.split(" at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "home"
        assert httpx.get(url + "/api/tags", timeout=10).json()["models"][0]["model"] == "home:latest"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_cli_serve_names_a_port_in_use(capsys):
    from needle_cy.cli import main
    taken = bind("127.0.0.1", 0)
    try:
        assert main(["serve", "--port", str(taken.getsockname()[1])]) == 1
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and "--port" in err


def test_without_the_serve_extra_the_core_cli_works_and_serve_says_what_to_install():
    code = ("import sys; sys.modules['starlette'] = sys.modules['uvicorn'] = None\n"
            "import needle_cy.cli, needle_cy.serve.engine, needle_cy.serve.protocol\n"
            "assert needle_cy.cli.main(['inspect', str(needle_cy.agent.DEFAULT_MODEL_PATH)]) == 0\n"
            "sys.exit(needle_cy.cli.main(['serve']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "needle-cy serve needs the serve extra" in proc.stderr
    assert "pip install 'needle_cy[serve]'" in proc.stderr
