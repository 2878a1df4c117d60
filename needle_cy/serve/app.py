"""The HTTP side of ``needle-cy serve``: a Starlette app speaking OpenAI's Chat Completions
and Ollama's chat over one ``Engine``, and ``run`` to serve it with uvicorn.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models[/{id}]`` (OpenAI);
``POST /api/chat``, ``GET /api/tags``, ``GET /api/ps``, ``GET /api/version``,
``POST /api/show``, ``POST /api/pull`` (Ollama); ``GET /health`` (the engine's queue and
counters); ``GET /`` (a liveness line, as Ollama answers).  Errors have the shape of the
convention of the path: ``{"error": {"message", "type", "param", "code"}}`` under
``/v1``, ``{"error": "..."}`` under ``/api``.

A chat request is read whole (at most ``max_body_bytes``), checked, queued on the engine,
and answered when the engine has begun its turn: until then any error still gets its own
status code, streaming included.  A client that disconnects (before or during its turn)
cancels the turn.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import sys
from typing import Any, Callable, Dict, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from .engine import Engine
from .protocol import (OLLAMA, OPENAI, RequestError, ollama_error, ollama_message, ollama_reply,
                       openai_call_deltas, openai_chunk, openai_completion, openai_error, parse_chat,
                       unix_time)

__all__ = ["create_app", "run", "DEFAULT_MAX_BODY_BYTES", "is_loopback"]

DEFAULT_MAX_BODY_BYTES = 1 << 20


def _flavor(path):
    return OLLAMA if path.startswith("/api/") else OPENAI


def _error_response(err: RequestError, flavor: str) -> Response:
    body = ollama_error(err) if flavor == OLLAMA else openai_error(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def _compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _json_line(obj):
    return _compact(obj) + "\n"


def _sse(obj):
    return "data: " + _compact(obj) + "\n\n"


class _ModelInfo:
    """What the listing endpoints say about the served model (file facts read once)."""

    def __init__(self, engine: Engine):
        self.name = engine.name
        path = engine.model_path
        self.size = os.path.getsize(path) if path and os.path.exists(path) else 0
        self.mtime = os.path.getmtime(path) if path and os.path.exists(path) else 0.0
        self.path = path
        self._digest = None
        config = getattr(engine.model, "config", None)
        self.context = int(getattr(config, "max_seq_len", 0) or 0)
        count = getattr(getattr(engine.model, "archive", None), "parameter_count", None)
        self.parameters = "" if not count else (f"{count / 1e9:.1f}B" if count >= 1e9
                                                 else f"{max(1, round(count / 1e6))}M")

    @property
    def digest(self):
        """An identifier of the archive file (Ollama's is the blob's sha256; clients only
        compare it).  Its path, size and time stand in for the bytes, which need not be
        read: an archive may be hundreds of MB on an SD card."""
        if self._digest is None:
            import hashlib
            self._digest = hashlib.sha256(f"{self.path}:{self.size}:{self.mtime}".encode()).hexdigest()
        return self._digest

    def modified(self):
        import datetime
        stamp = datetime.datetime.fromtimestamp(self.mtime, datetime.timezone.utc)
        return stamp.isoformat().replace("+00:00", "Z")

    def details(self):
        return {"parent_model": "", "format": "cact", "family": "needle", "families": ["needle"],
                "parameter_size": self.parameters, "quantization_level": "CQ"}

    def ollama_entry(self):
        tagged = f"{self.name}:latest"
        return {"name": tagged, "model": tagged, "modified_at": self.modified(), "size": self.size,
                "digest": self.digest, "details": self.details()}


def create_app(engine: Engine, api_key: Optional[str] = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The ASGI app over ``engine``.  ``api_key``: every route but ``GET /`` needs
    ``Authorization: Bearer <api_key>``.  ``max_body_bytes``: larger request bodies get 413."""
    info = _ModelInfo(engine)
    key = api_key.encode("utf-8") if api_key else None

    def guarded(handler: Callable) -> Callable:
        async def endpoint(request: Request) -> Response:
            flavor = _flavor(request.url.path)
            try:
                if key is not None:
                    scheme, _, token = request.headers.get("authorization", "").partition(" ")
                    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"), key):
                        raise RequestError(401, "missing or wrong API key: send the header "
                                                "'Authorization: Bearer <key>' with the key the "
                                                "server was started with", code="invalid_api_key",
                                           headers={"WWW-Authenticate": "Bearer"})
                return await handler(request)
            except RequestError as err:
                return _error_response(err, flavor)
        return endpoint

    async def read_json(request):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise RequestError(413, f"the request body has {int(length)} bytes, more than this "
                                    f"server's limit of {max_body_bytes}", code="request_too_large")
        data, size = bytearray(), 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise RequestError(413, f"the request body is larger than this server's limit of "
                                        f"{max_body_bytes} bytes", code="request_too_large")
            data += chunk
        try:
            return json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}",
                               code="invalid_json") from None

    def check_model(name):
        if not engine.matches(name):
            raise RequestError(404, f"model {name!r} not found: this server serves "
                                    f"{engine.name!r}", param="model", code="model_not_found")

    async def chat(request, flavor):
        req = parse_chat(await read_json(request), flavor)
        check_model(req.model)
        loop = asyncio.get_running_loop()
        events: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()

        def deliver(event):
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = engine.submit(req, deliver)
        watcher = asyncio.ensure_future(_watch_disconnect(request, job))
        handed_over = False
        try:
            first = await events.get()
            if first["type"] == "error":
                raise first["error"]
            if first["type"] == "cancelled":
                raise RequestError(503, "the request was cancelled", code="cancelled")
            if req.stream:
                body = (_openai_stream if flavor == OPENAI else _ollama_stream)(
                    req, engine.name, first, events, job, watcher)
                handed_over = True
                media = "text/event-stream" if flavor == OPENAI else "application/x-ndjson"
                return StreamingResponse(body, media_type=media,
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            event = first
            while event["type"] not in ("result", "error", "cancelled"):
                event = await events.get()        # begin, reasoning: the outcome has it all
            if event["type"] == "error":
                raise event["error"]
            if event["type"] == "cancelled":
                raise RequestError(503, "the request was cancelled", code="cancelled")
            outcome = event["outcome"]
            if flavor == OPENAI:
                return JSONResponse(openai_completion(_completion_id(), unix_time(), engine.name, outcome))
            message = ollama_message(outcome.calls, outcome.reasoning if req.think else "")
            return JSONResponse(ollama_reply(engine.name, message, outcome))
        except BaseException:
            job.cancel()                 # an error, or this handler cancelled: stop the turn
            raise
        finally:
            if not handed_over:
                watcher.cancel()

    async def openai_chat(request):
        return await chat(request, OPENAI)

    async def ollama_chat(request):
        return await chat(request, OLLAMA)

    def openai_model():
        return {"id": engine.name, "object": "model", "created": int(info.mtime), "owned_by": "needle-cy"}

    async def list_models(request):
        return JSONResponse({"object": "list", "data": [openai_model()]})

    async def get_model(request):
        check_model(request.path_params["model"])
        return JSONResponse(openai_model())

    async def tags(request):
        return JSONResponse({"models": [info.ollama_entry()]})

    async def ps(request):
        entry = dict(info.ollama_entry(), expires_at="2318-01-01T00:00:00Z", size_vram=0,
                     context_length=info.context)
        return JSONResponse({"models": [entry]})

    async def version(request):
        return JSONResponse({"version": __version__})

    async def show(request):
        body = await read_json(request)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise RequestError(400, "'model' is missing", param="model")
        check_model(name)
        return JSONResponse({"modelfile": "", "parameters": "", "template": "",
                             "details": info.details(), "capabilities": ["tools"],
                             "model_info": {"general.architecture": "needle",
                                            "needle.context_length": info.context},
                             "modified_at": info.modified()})

    async def pull(request):
        body = await read_json(request)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise RequestError(400, "'model' is missing", param="model")
        check_model(name)          # the served model is there already; nothing is downloaded
        if isinstance(body, dict) and body.get("stream") is False:
            return JSONResponse({"status": "success"})
        return Response(_json_line({"status": "success"}), media_type="application/x-ndjson")

    async def health(request):
        return JSONResponse(engine.status())

    async def root(request):
        return PlainTextResponse(f"needle-cy is running (model {engine.name})")

    async def http_error(request, exc):
        flavor = _flavor(request.url.path)
        what = ("no such route: " + request.url.path if exc.status_code == 404
                else f"{request.method} is not allowed on {request.url.path}")
        return _error_response(RequestError(exc.status_code, what, code="not_found"
                                            if exc.status_code == 404 else "method_not_allowed"),
                               flavor)

    routes = [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/health", guarded(health), methods=["GET"]),
        Route("/v1/chat/completions", guarded(openai_chat), methods=["POST"]),
        Route("/v1/models", guarded(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(get_model), methods=["GET"]),
        Route("/api/chat", guarded(ollama_chat), methods=["POST"]),
        Route("/api/tags", guarded(tags), methods=["GET"]),
        Route("/api/ps", guarded(ps), methods=["GET"]),
        Route("/api/version", guarded(version), methods=["GET"]),
        Route("/api/show", guarded(show), methods=["POST"]),
        Route("/api/pull", guarded(pull), methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def _completion_id():
    import uuid
    return "chatcmpl-" + uuid.uuid4().hex[:24]


async def _watch_disconnect(request, job):
    """Cancel ``job`` when the client goes away (an ASGI ``http.disconnect``)."""
    receive = request.receive
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            job.cancel()
            return


async def _openai_stream(req, model, first, events, job, watcher):
    completion_id, created = _completion_id(), unix_time()
    done = False
    try:
        yield _sse(openai_chunk(completion_id, created, model, {"role": "assistant", "content": ""}))
        event = first
        while True:
            kind = event["type"]
            if kind == "reasoning":
                yield _sse(openai_chunk(completion_id, created, model, {"reasoning_content": event["delta"]}))
            elif kind == "result":
                outcome = event["outcome"]
                for delta in openai_call_deltas(outcome.calls):
                    yield _sse(openai_chunk(completion_id, created, model, delta))
                yield _sse(openai_chunk(completion_id, created, model, {}, finish=outcome.finish))
                if req.include_usage:
                    yield _sse(openai_chunk(completion_id, created, model, None, usage=outcome))
                yield "data: [DONE]\n\n"
                done = True
                return
            elif kind in ("error", "cancelled"):
                err = event["error"] if kind == "error" else RequestError(503, "the request was cancelled",
                                                                         code="cancelled")
                yield _sse(openai_error(err))
                done = True
                return
            event = await events.get()
    finally:
        if not done:
            job.cancel()
        watcher.cancel()


async def _ollama_stream(req, model, first, events, job, watcher):
    done = False
    try:
        event = first
        while True:
            kind = event["type"]
            if kind == "reasoning" and req.think:
                yield _json_line(ollama_reply(model, ollama_message(thinking=event["delta"])))
            elif kind == "result":
                outcome = event["outcome"]
                if outcome.calls:
                    yield _json_line(ollama_reply(model, ollama_message(outcome.calls)))
                yield _json_line(ollama_reply(model, ollama_message(), outcome))
                done = True
                return
            elif kind in ("error", "cancelled"):
                err = event["error"] if kind == "error" else RequestError(503, "the request was cancelled",
                                                                         code="cancelled")
                yield _json_line(ollama_error(err))
                done = True
                return
            event = await events.get()
    finally:
        if not done:
            job.cancel()
        watcher.cancel()


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (port 0: a free port)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(engine: Engine, host: str = "127.0.0.1", port: int = 11434, api_key: Optional[str] = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, log_level: str = "warning",
        sock: Optional[socket.socket] = None,
        announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Serve ``engine`` on ``host``:``port`` (or the listening ``sock`` from ``bind``) until
    interrupted (SIGINT/SIGTERM), then close it."""
    import uvicorn
    if sock is None:
        sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    config = uvicorn.Config(create_app(engine, api_key=api_key, max_body_bytes=max_body_bytes),
                            log_level=log_level, lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    announce(f"needle-cy serve: model {engine.name!r} at http://{shown}:{bound_port} "
             f"(OpenAI base_url http://{shown}:{bound_port}/v1, Ollama host http://{shown}:{bound_port})")
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
