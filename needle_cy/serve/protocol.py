"""The two chat conventions ``needle-cy serve`` speaks, read into one ``ChatRequest`` and
written back from one ``Outcome``.  Plain Python: no web framework is imported here.

OpenAI Chat Completions (``POST /v1/chat/completions``) and Ollama's chat
(``POST /api/chat``) carry the same conversation in different field names: a message list
(system, user, assistant with tool calls, tool results), the tools as JSON-Schema
functions, and whether to stream.  The conversation maps onto the Needle template turn by
turn:

* system (and OpenAI ``developer``) messages → the system block (joined by newlines);
* a user message → a request turn (consecutive user messages are joined by newlines);
* the tool messages after an assistant message with tool calls → one tool-result turn
  (``<tool_result>``), the results in message order; a result that is JSON text is fed
  as that JSON value, any other text as a JSON string (as ``Needle.complete`` feeds a
  list of results);
* an assistant message → the answer of the turn before it: its tool calls (its text is
  not part of the template: Needle models answer with calls only).

The last message must be the turn to answer (a user message or tool results).  A reply
without calls is an assistant message with empty content (Needle models write no prose;
the model's notes, when it writes any, travel as ``reasoning_content`` / ``thinking``).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

__all__ = ["OPENAI", "OLLAMA", "RequestError", "Turn", "ChatRequest", "Outcome", "parse_chat",
           "openai_completion", "openai_chunk", "openai_call_deltas", "openai_error", "ollama_message",
           "ollama_reply", "ollama_error", "tool_call_id", "conversation_keys"]

OPENAI, OLLAMA = "openai", "ollama"

# OpenAI's error "type" by HTTP status
_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
                 404: "invalid_request_error", 413: "invalid_request_error",
                 429: "rate_limit_error", 503: "server_error"}


class RequestError(Exception):
    """A request the server turns down: the HTTP ``status``, a message saying what was
    wrong and what to do, the request field concerned (OpenAI's ``param``), a short
    ``code`` and extra response ``headers`` (``Retry-After``)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})


def _bad(message, param=None, code=None):
    return RequestError(400, message, param=param, code=code)


@dataclass
class Turn:
    """One turn of the conversation as the template holds it: the request text or the
    tool results, and the calls the assistant answered with (``None`` for the turn to
    answer)."""

    text: Union[str, List[Any]]
    is_results: bool
    calls: Optional[List[Dict[str, Any]]] = None
    index: int = 0                  # the message that closes the turn (for error messages)

    def key(self) -> str:
        """What identifies the turn across requests: its input as the model reads it, and
        its calls with keys sorted (a client may re-serialise the arguments)."""
        text = json.dumps(self.text, ensure_ascii=False, default=str) if self.is_results else self.text
        calls = json.dumps(self.calls or [], sort_keys=True, ensure_ascii=False)
        return json.dumps(["results" if self.is_results else "request", text, calls], ensure_ascii=False)


def conversation_keys(turns: List[Turn]) -> List[str]:
    """Digest of each leading run ``turns[:n]`` (n = 1..len): equal digests, equal
    conversations so far."""
    out, h = [], hashlib.sha256()
    for turn in turns:
        h.update(turn.key().encode("utf-8"))
        h.update(b"\x00")
        out.append(h.copy().hexdigest())
    return out


@dataclass
class ChatRequest:
    """A chat request of either convention, read and checked."""

    flavor: str
    model: str
    tools: List[Dict[str, Any]]
    system: Optional[str]
    history: List[Turn]                 # finished turns, each with its calls
    final: Turn                         # the turn to answer
    tool_choice: str = "auto"           # auto | none | required | function
    tool_name: Optional[str] = None     # with tool_choice "function"
    max_tokens: Optional[int] = None
    parallel_calls: bool = True
    stream: bool = False
    include_usage: bool = False
    think: bool = False


@dataclass
class Outcome:
    """What the engine made of a request."""

    calls: List[Dict[str, Any]] = field(default_factory=list)
    reasoning: str = ""
    finish: str = "stop"                # tool_calls | stop | length
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0              # prompt tokens not computed again (see engine)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0


# ------------------------------------------------------------------ reading

def parse_chat(body: Any, flavor: str) -> ChatRequest:
    """A ``ChatRequest`` from a decoded JSON body of ``flavor`` (``OPENAI`` or
    ``OLLAMA``); ``RequestError`` (400) naming the field when it cannot be served."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {_json_type(body)}")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad("'model' is missing: give the model name (GET /v1/models or /api/tags lists it)",
                   param="model")
    tools = _read_tools(body.get("tools"))
    names = [t["name"] for t in tools]
    system, history, final = _read_messages(body.get("messages"), flavor)
    req = ChatRequest(flavor=flavor, model=model.strip(), tools=tools, system=system,
                      history=history, final=final)
    if flavor == OPENAI:
        req.stream = _flag(body, "stream", False)
        options = body.get("stream_options")
        if options is not None:
            if not isinstance(options, dict):
                raise _bad("'stream_options' must be an object", param="stream_options")
            req.include_usage = bool(options.get("include_usage"))
        req.tool_choice, req.tool_name = _read_tool_choice(body.get("tool_choice"), names)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None:
            if not _is_int(limit) or limit < 1:
                raise _bad(f"max_tokens must be an integer >= 1, got {json.dumps(limit)}", param="max_tokens")
            req.max_tokens = int(limit)
        n = body.get("n")
        if n is not None and n != 1:
            raise _bad(f"n={json.dumps(n)}: this server returns one choice (n=1)", param="n")
        if body.get("parallel_tool_calls") is False:
            req.parallel_calls = False
        fmt = body.get("response_format")
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise _bad("response_format is not supported: Needle models answer with tool calls; "
                       "describe the output as a tool and set tool_choice to that function",
                       param="response_format")
    else:
        req.stream = _flag(body, "stream", True)      # Ollama streams unless told not to
        req.think = bool(body.get("think"))
        options = body.get("options")
        if options is not None and not isinstance(options, dict):
            raise _bad("'options' must be an object", param="options")
        limit = (options or {}).get("num_predict")
        if limit is not None:
            if not _is_int(limit):
                raise _bad(f"options.num_predict must be an integer, got {json.dumps(limit)}",
                           param="options")
            req.max_tokens = int(limit) if limit > 0 else None    # -1 / -2: no limit
        if body.get("format") not in (None, ""):
            raise _bad("'format' (structured output) is not supported: Needle models answer "
                       "with tool calls; describe the output as a tool instead", param="format")
    if req.tool_choice in ("required", "function") and not tools:
        raise _bad(f"tool_choice {req.tool_choice!r} needs tools: the request has none",
                   param="tool_choice")
    return req


def _json_type(value):
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(body, key, default):
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{key}' must be true or false, got {json.dumps(value)}", param=key)
    return value


def _read_tools(tools):
    """The tool definitions, unwrapped from ``{"type": "function", "function": {...}}``.
    Their schemas are checked when the engine builds the agent (``Needle``), which names
    the tool and the path of what it cannot take."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad(f"'tools' must be an array of function definitions, got {_json_type(tools)}",
                   param="tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where} must be an object, got {_json_type(tool)}", param="tools")
        kind = tool.get("type", "function")
        if kind != "function":
            raise _bad(f"{where}: type {json.dumps(kind)} is not supported; only function tools "
                       f'({{"type": "function", "function": {{...}}}})', param="tools")
        fn = tool.get("function", tool if "name" in tool else None)
        if not isinstance(fn, dict):
            raise _bad(f'{where}: "function" must be an object with name, description and '
                       f"parameters", param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _bad(f"{where}.function.name is missing", param="tools")
        if name in seen:
            raise _bad(f"{where}: the tool name {name!r} is used twice", param="tools")
        seen.add(name)
        # OpenAI's "strict" says how to decode, not what the tool is: the grammar always
        # enforces the schema, and the prompt shows what the model was trained on
        out.append({k: v for k, v in fn.items() if k != "strict"})
    return out


def _read_tool_choice(choice, names):
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise _bad('tool_choice: give the function as {"type": "function", "function": '
                       '{"name": "..."}}', param="tool_choice")
        if name not in names:
            raise _bad(f"tool_choice names the function {name!r}, which is not among the request's "
                       f"tools ({', '.join(names) or 'none'})", param="tool_choice")
        return "function", name
    raise _bad(f"tool_choice must be 'auto', 'none', 'required' or a named function, got "
               f"{json.dumps(choice)}", param="tool_choice")


def _content_text(content, where, flavor):
    """The text of a message's content: a string, null, or (OpenAI) text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if flavor == OPENAI and isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else _json_type(part)
                raise _bad(f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                           param="messages")
        return "".join(parts)
    raise _bad(f"{where}.content must be a string, got {_json_type(content)}", param="messages")


def _read_calls(message, where, flavor):
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be an array", param="messages")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f'{at}: expected {{"function": {{"name": ..., "arguments": ...}}}}',
                       param="messages")
        args = fn.get("arguments")
        if isinstance(args, str):         # OpenAI: JSON text (Ollama clients may send it too)
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                raise _bad(f"{at}.function.arguments is not valid JSON ({exc})", param="messages") from None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _bad(f"{at}.function.arguments must be a JSON object, got {_json_type(args)}",
                       param="messages")
        out.append({"name": fn["name"], "arguments": args})
    return out


def _result_value(text):
    """A tool message's content as the model is given it: JSON text as its value, other
    text as a string."""
    stripped = text.strip()
    if stripped:
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text


def _read_messages(messages, flavor):
    """(system text or None, finished turns, the turn to answer)."""
    if not isinstance(messages, list):
        raise _bad("'messages' must be an array of messages", param="messages")
    if not messages:
        raise _bad("'messages' is empty: give at least one user message", param="messages")
    system, history = [], []
    pending = None                      # the open turn: Turn without calls
    after_calls = False                 # the previous message was an assistant's tool calls (or a result)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where} must be an object, got {_json_type(message)}", param="messages")
        role = message.get("role")
        if flavor == OLLAMA and message.get("images"):
            raise _bad(f"{where}: images are not supported (Needle models read text)", param="messages")
        if role in ("system", "developer"):
            system.append(_content_text(message.get("content"), where, flavor))
            continue
        if role == "user":
            text = _content_text(message.get("content"), where, flavor)
            if pending is not None and pending.is_results:
                # results the assistant did not answer: the turn closes without calls
                pending.calls, pending.index = [], i
                history.append(pending)
                pending = None
            if pending is None:
                pending = Turn(text, False, index=i)
            else:
                pending.text = f"{pending.text}\n{text}"
            after_calls = False
        elif role in ("tool", "function"):
            if pending is None and not after_calls:
                raise _bad(f"{where}: a tool result must follow an assistant message with "
                           f"tool_calls", param="messages")
            if pending is not None and not pending.is_results:
                raise _bad(f"{where}: a tool result after a user message; tool results answer the "
                           f"assistant's tool_calls", param="messages")
            value = _result_value(_content_text(message.get("content"), where, flavor))
            if pending is None:
                pending = Turn([], True, index=i)
            pending.text.append(value)
        elif role == "assistant":
            calls = _read_calls(message, where, flavor)
            if pending is None:
                if history:             # consecutive assistant messages: one answer
                    history[-1].calls.extend(calls)
                    after_calls = bool(history[-1].calls)
                    continue
                if calls:
                    raise _bad(f"{where}: assistant tool calls before any user message",
                               param="messages")
                continue                # a greeting before the first request: not a turn
            pending.calls, pending.index = calls, i
            history.append(pending)
            pending = None
            after_calls = bool(calls)
        else:
            raise _bad(f"{where}.role must be system, user, assistant or tool, got "
                       f"{json.dumps(role)}", param="messages")
    if pending is None:
        if not history:
            raise _bad("'messages' holds no user message: give the request as a user message",
                       param="messages")
        raise _bad(f"the last message (messages[{len(messages) - 1}]) is the assistant's: end "
                   f"with the user message or the tool results to answer", param="messages")
    text = "\n".join(s for s in system if s.strip())
    return (text or None), history, pending


# ------------------------------------------------------------------ writing

def tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _usage(outcome):
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}


def _arguments_text(call):
    """A call's arguments as OpenAI carries them: JSON text (compact, as the model wrote it)."""
    return json.dumps(call.get("arguments") or {}, ensure_ascii=False, separators=(",", ":"))


def _openai_calls(calls, ids):
    return [{"id": cid, "type": "function",
             "function": {"name": c["name"],
                          "arguments": _arguments_text(c)}}
            for c, cid in zip(calls, ids)]


def openai_completion(completion_id: str, created: int, model: str, outcome: Outcome) -> Dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed request."""
    message: Dict[str, Any] = {"role": "assistant", "content": None if outcome.calls else ""}
    if outcome.calls:
        message["tool_calls"] = _openai_calls(outcome.calls, [tool_call_id() for _ in outcome.calls])
    if outcome.reasoning:
        message["reasoning_content"] = outcome.reasoning
    return {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": outcome.finish}],
            "usage": _usage(outcome)}


def openai_chunk(completion_id: str, created: int, model: str, delta: Optional[Dict[str, Any]],
                 finish: Optional[str] = None, usage: Optional[Outcome] = None) -> Dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` with ``usage`` is the closing usage
    chunk (``stream_options.include_usage``)."""
    chunk: Dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk",
                             "created": created, "model": model, "choices": []}
    if delta is not None:
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    if usage is not None:
        chunk["usage"] = _usage(usage)
    return chunk


def openai_call_deltas(calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The ``delta`` objects that stream ``calls``: per call its id and name, then its
    arguments (as OpenAI streams them, in pieces a client concatenates)."""
    out = []
    for index, call in enumerate(calls):
        out.append({"tool_calls": [{"index": index, "id": tool_call_id(), "type": "function",
                                    "function": {"name": call["name"], "arguments": ""}}]})
        out.append({"tool_calls": [{"index": index, "function": {"arguments": _arguments_text(call)}}]})
    return out


def openai_error(err: RequestError) -> Dict[str, Any]:
    return {"error": {"message": err.message,
                      "type": _OPENAI_TYPES.get(err.status, "server_error" if err.status >= 500
                                                else "invalid_request_error"),
                      "param": err.param, "code": err.code}}


def _now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_message(calls: Optional[List[Dict[str, Any]]] = None, thinking: str = "") -> Dict[str, Any]:
    message: Dict[str, Any] = {"role": "assistant", "content": ""}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [{"function": {"name": c["name"], "arguments": c.get("arguments") or {}}}
                                 for c in calls]
    return message


def ollama_reply(model: str, message: Dict[str, Any], outcome: Optional[Outcome] = None) -> Dict[str, Any]:
    """An ``/api/chat`` reply: a streamed piece (``outcome=None``) or the final one with
    Ollama's counters (durations in nanoseconds)."""
    reply: Dict[str, Any] = {"model": model, "created_at": _now_rfc3339(), "message": message,
                             "done": outcome is not None}
    if outcome is not None:
        reply.update({
            "done_reason": "length" if outcome.finish == "length" else "stop",
            "total_duration": int(outcome.total_s * 1e9), "load_duration": 0,
            "prompt_eval_count": outcome.prompt_tokens,
            "prompt_eval_duration": int(outcome.prefill_s * 1e9),
            "eval_count": outcome.completion_tokens, "eval_duration": int(outcome.decode_s * 1e9)})
    return reply


def ollama_error(err: RequestError) -> Dict[str, Any]:
    return {"error": err.message}


def unix_time() -> int:
    return int(time.time())
