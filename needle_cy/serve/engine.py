"""The engine behind ``needle-cy serve``: one model, one worker thread, requests served in
the order they came from a bounded queue.  No web framework is imported here; the app
(``needle_cy.serve.app``) hands it ``ChatRequest``s and receives events.

Per request the worker

1. takes the ``Needle`` agent of the request's tools and system text (an LRU of agents
   that share the one loaded model; an agent keeps its tool block prefilled, and its
   prefix checkpoints, across conversations);
2. resumes the longest part of the conversation it has already computed: clients resend
   the whole conversation every turn, so after answering a turn the worker keeps the
   conversation's state (``Needle.snapshot``) under the digest of its turns, and the next
   request, which holds those turns plus the tool results, restores it and prefills only
   the new turn.  Turns it has not seen (another client's history, an evicted state) are
   put in with ``Needle.add_turn`` (their calls, without the reasoning a live turn holds);
3. runs the final turn with ``Needle.stream``, passing its reasoning on as it is written,
   and delivers the calls.  ``tool_choice`` ``required`` and a named function run with
   ``require_call`` / ``require_tool``; their calls include the ones the confidence and
   negation checks hold back (``suppressed_calls``), since the client demanded a call.
   ``none`` runs no model (the answer has no calls whatever the model would write).

Events delivered to a job (``deliver`` is called from the worker thread): ``begin`` (the
turn is being generated: a streamed response may start), ``reasoning`` (``delta``),
then exactly one of ``result`` (``outcome``), ``error`` (``error``: a ``RequestError``)
or ``cancelled``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import traceback
from collections import OrderedDict, deque
from typing import Any, Callable, Dict, Optional

from ..agent import DEFAULT_MODEL_PATH, Needle
from ..errors import ContextOverflowError, GrammarLimitError, NeedleError, SchemaError
from .protocol import ChatRequest, Outcome, RequestError, Turn, conversation_keys

__all__ = ["Engine", "Job", "default_model_name"]

log = logging.getLogger("needle_cy.serve")


class _Cancelled(Exception):
    pass


def default_model_name(source: Any = None) -> str:
    """The name clients use for the model: ``needle-cy`` for the embedded model, else the
    archive's file name (its folder's when the file is ``model.cact``), or the name part
    of a Hugging Face id."""
    if source is None:
        return "needle-cy"
    text = str(getattr(source, "path", source)).split("@", 1)[0].rstrip("/\\")
    parts = [p for p in text.replace("\\", "/").split("/") if p]
    if not parts:
        return "needle-cy"
    name = parts[-1]
    if name.endswith(".cact"):
        name = name[:-len(".cact")]
        if name == "model" and len(parts) > 1:
            name = parts[-2]
    return name.replace(" ", "-").lower() or "needle-cy"


class Job:
    """One request in the engine.  ``cancel()`` (any thread) drops it from the queue or
    stops its generation."""

    def __init__(self, engine: "Engine", request: ChatRequest,
                 deliver: Callable[[Dict[str, Any]], None]) -> None:
        self.engine = engine
        self.request = request
        self._deliver = deliver
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()

    def deliver(self, event: Dict[str, Any]) -> None:
        try:
            self._deliver(event)
        except Exception:            # a receiver gone (its event loop closed) must not stop the worker
            log.debug("a job's receiver failed", exc_info=True)

    def cancel(self) -> None:
        self.engine._cancel(self)


class _Slot:
    """An agent for one (tools, system text, calls per turn)."""

    def __init__(self, key, agent):
        self.key = key
        self.agent = agent


class Engine:
    """One model serving chat requests in order.

    model, model_file, threads, tokenizer: as ``Needle`` takes them (``None``: the
        embedded model).
    name: the model's name for clients (default ``default_model_name(model)``); requests
        may also name it with Ollama's ``:latest`` tag.
    max_queue: requests waiting behind the running one; one more is turned down with 503
        and ``Retry-After``.
    max_agents: tool sets (with their system text) kept ready.
    max_conversations / conversation_mb: conversation states kept to resume (each holds a
        model state, about 0.5 MB per 500 tokens with the embedded model).
    checkpoint_mb: each agent's prefix checkpoints (``Needle(prefix_checkpoint_mb=)``).
    ignore_system: drop the clients' system messages (a client's long instructions may
        not fit a small model's context; Needle models read tools, not instructions).
    """

    def __init__(self, model: Any = None, *, model_file: Optional[str] = None,
                 threads: Optional[int] = None, tokenizer: Any = None, name: Optional[str] = None,
                 max_queue: int = 8, max_agents: int = 4, max_conversations: int = 32,
                 conversation_mb: float = 64.0, checkpoint_mb: float = 8.0,
                 ignore_system: bool = False) -> None:
        for label, value, least in (("max_queue", max_queue, 0), ("max_agents", max_agents, 1),
                                    ("max_conversations", max_conversations, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
        base = Needle(model, tools=[], tokenizer=tokenizer, threads=threads, model_file=model_file)
        self.model, self.tokenizer, self.model_path = base.model, base.tokenizer, base.model_path
        if model is not None and not isinstance(model, (str, os.PathLike)):
            # a Model or Archive object: named after its file, the embedded one as "needle-cy"
            same = self.model_path and os.path.realpath(self.model_path) == os.path.realpath(DEFAULT_MODEL_PATH)
            model = None if same or not self.model_path else self.model_path
        self.name = name or default_model_name(model)
        self.max_queue = max_queue
        self.max_agents = max_agents
        self.max_conversations = max_conversations
        self.conversation_bytes = int(float(conversation_mb) * 2 ** 20)
        self.checkpoint_mb = float(checkpoint_mb)
        self.ignore_system = bool(ignore_system)
        self._tools_end = self.tokenizer.marker_id("</tools>")
        self._slots = OrderedDict()            # agent key -> _Slot
        self._conversations = OrderedDict()    # (agent key, digest) -> ConversationSnapshot
        self._conversation_bytes = 0
        self._grammars = OrderedDict()         # shared by the agents: (schemas, max calls) -> grammar
        self._queue = deque()
        self._cond = threading.Condition()
        self._running = None                   # (job, agent) while a turn is being generated
        self._current_job = None
        self._closing = False
        self._job_s = 0.5                      # running mean of a job's time (Retry-After)
        self.stats = {"served": 0, "cancelled": 0, "rejected": 0, "failed": 0, "resumed": 0}
        self._worker = threading.Thread(target=self._work, name="needle-cy-engine", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------ the queue
    def matches(self, name: str) -> bool:
        """Whether a request's model name means this model (``name`` or ``name:latest``)."""
        return name in (self.name, f"{self.name}:latest")

    def submit(self, request: ChatRequest, deliver: Callable[[Dict[str, Any]], None]) -> Job:
        """Queue a request; ``RequestError`` 503 with ``Retry-After`` when the queue is full."""
        job = Job(self, request, deliver)
        with self._cond:
            if self._closing:
                raise RequestError(503, "the server is shutting down", code="shutting_down")
            busy = self._current_job is not None or bool(self._queue)
            if len(self._queue) >= self.max_queue and busy:
                self.stats["rejected"] += 1
                wait = max(1, math.ceil(self._job_s * (len(self._queue) + 1)))
                raise RequestError(503, f"the server is busy: {len(self._queue)} requests are "
                                        f"waiting (at most {self.max_queue}); retry after {wait} s",
                                   code="server_busy", headers={"Retry-After": str(wait)})
            self._queue.append(job)
            self._cond.notify()
        return job

    def _cancel(self, job):
        with self._cond:
            if job.cancelled.is_set():
                return
            job.cancelled.set()
            if job in self._queue:
                self._queue.remove(job)
                self.stats["cancelled"] += 1
                job.deliver({"type": "cancelled"})
            elif self._running is not None and self._running[0] is job:
                self._running[1].cancel()

    def status(self) -> Dict[str, Any]:
        """Queue length, whether a request runs, the counters, what is cached."""
        with self._cond:
            return {"model": self.name, "queued": len(self._queue),
                    "running": self._current_job is not None, **self.stats,
                    "agents": len(self._slots), "conversations": len(self._conversations),
                    "conversation_mb": round(self._conversation_bytes / 2 ** 20, 2)}

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests, cancel the waiting and the running one, stop the worker."""
        with self._cond:
            self._closing = True
            waiting = list(self._queue)
            self._queue.clear()
            if self._running is not None:
                self._running[1].cancel()
            self._cond.notify_all()
        for job in waiting:
            job.cancelled.set()
            job.deliver({"type": "cancelled"})
        self._worker.join(timeout)

    def _work(self):
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                job = self._queue.popleft()
                self._current_job = job
            t0 = time.perf_counter()
            try:
                outcome = self._serve(job)
                outcome.total_s = time.perf_counter() - job.submitted
                counter = "served"
                job.deliver({"type": "result", "outcome": outcome})
            except _Cancelled:
                counter = "cancelled"
                job.deliver({"type": "cancelled"})
            except RequestError as err:
                counter = "failed"
                job.deliver({"type": "error", "error": err})
            except Exception as exc:    # a bug: answer 500 and keep serving
                counter = "failed"
                log.error("needle-cy serve: a request failed:\n%s", traceback.format_exc())
                job.deliver({"type": "error", "error": RequestError(
                    500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")})
            with self._cond:
                self.stats[counter] += 1
                self._current_job = None
                self._running = None
                self._job_s = 0.8 * self._job_s + 0.2 * (time.perf_counter() - t0)

    # ------------------------------------------------------------ a request
    def _slot(self, req):
        system = None if self.ignore_system else req.system
        max_calls = 4 if req.parallel_calls else 1
        key = hashlib.sha256(json.dumps([req.tools, system, max_calls], ensure_ascii=False,
                                        default=str).encode("utf-8")).hexdigest()
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        try:
            agent = Needle(self.model, tools=req.tools, tokenizer=self.tokenizer, system=system,
                           max_calls_per_turn=max_calls, prefix_checkpoint_mb=self.checkpoint_mb)
        except (SchemaError, GrammarLimitError) as exc:   # UnsupportedSchemaError is a SchemaError
            raise RequestError(400, f"{exc}", param="tools", code="invalid_tool_schema") from None
        except (NeedleError, ValueError, TypeError) as exc:
            raise RequestError(400, f"tools: {exc}", param="tools") from None
        agent.compile_grammar = self._compile_grammar
        slot = _Slot(key, agent)
        self._slots[key] = slot
        while len(self._slots) > self.max_agents:
            old, _ = self._slots.popitem(last=False)
            for ckey in [k for k in self._conversations if k[0] == old]:
                self._drop_conversation(ckey)
        return slot

    def _compile_grammar(self, schemas, max_calls):
        """The agents' grammars, shared: two tool sets that select the same tools (or a
        request's system text changing) compile and warm up one grammar."""
        from ..grammar import compile_tools
        key = (json.dumps(schemas, sort_keys=True), max_calls)
        grammar = self._grammars.get(key)
        if grammar is None:
            grammar = compile_tools(schemas, max_calls=max_calls)
            self._grammars[key] = grammar
            while len(self._grammars) > 4 * self.max_agents:
                self._grammars.popitem(last=False)
        self._grammars.move_to_end(key)
        return grammar

    def _store_conversation(self, key, snapshot):
        if self.max_conversations == 0 or snapshot.nbytes > self.conversation_bytes:
            return
        if key in self._conversations:
            self._drop_conversation(key)
        self._conversations[key] = snapshot
        self._conversation_bytes += snapshot.nbytes
        while (len(self._conversations) > self.max_conversations
               or self._conversation_bytes > self.conversation_bytes):
            self._drop_conversation(next(iter(self._conversations)))

    def _drop_conversation(self, key):
        snapshot = self._conversations.pop(key)
        self._conversation_bytes -= snapshot.nbytes

    def _serve(self, job):
        req = job.request
        slot = self._slot(req)
        if req.tool_choice == "none":
            return Outcome(finish="stop")
        agent = slot.agent
        keys = conversation_keys(req.history)
        start, snapshot = 0, None
        for n in range(len(keys), 0, -1):
            snapshot = self._conversations.get((slot.key, keys[n - 1]))
            if snapshot is not None:
                self._conversations.move_to_end((slot.key, keys[n - 1]))
                start = n
                break
        if snapshot is not None:
            agent.restore(snapshot)
            self.stats["resumed"] += 1
        else:
            agent.reset()
        for turn in req.history[start:]:
            if job.cancelled.is_set():
                raise _Cancelled()
            try:
                agent.add_turn(turn.text, turn.calls)
            except ContextOverflowError as exc:
                raise RequestError(400, f"messages: {exc}", param="messages",
                                   code="context_length_exceeded") from None
            except (NeedleError, ValueError) as exc:
                raise RequestError(400, f"messages[{turn.index}]: this turn cannot be put into "
                                        f"the conversation: {exc}", param="messages") from None
        before = len(agent.conversation_ids())
        forced = req.tool_choice in ("required", "function")
        final_event = None
        with self._cond:
            if job.cancelled.is_set():
                raise _Cancelled()
            self._running = (job, agent)
        began = False
        try:
            events = agent.stream(req.final.text, max_new_tokens=req.max_tokens,
                                  require_call=True if req.tool_choice == "required" else None,
                                  require_tool=req.tool_name)
            for event in events:
                kind = event["type"]
                if kind in ("done", "error"):
                    # no cancel() reaches the agent from here on: its turn is over, and the
                    # generator's end clears a cancel that came before this
                    with self._cond:
                        self._running = None
                    final_event = event
                    continue
                if kind != "start" and not began:
                    began = True
                    job.deliver({"type": "begin"})
                if kind == "thinking_delta":
                    job.deliver({"type": "reasoning", "delta": event["delta"]})
        except (NeedleError, ValueError) as exc:
            raise RequestError(400, f"{exc}", param="messages") from None
        finally:
            with self._cond:
                self._running = None
        return self._outcome(job, slot, agent, final_event, snapshot, before, forced)

    def _outcome(self, job, slot, agent, event, snapshot, before, forced):
        """The Outcome of the finished turn ``event``; keeps the conversation's state."""
        req = job.request
        if event["type"] == "error":
            exc = event.get("exception")
            if event["error_code"] == "cancelled":
                raise _Cancelled()
            if isinstance(exc, ContextOverflowError):
                hint = ("" if self.ignore_system or not req.system else
                        " (needle-cy serve --ignore-system leaves out the clients' system messages)")
                raise RequestError(400, f"{exc}{hint}", param="messages",
                                   code="context_length_exceeded")
            if isinstance(exc, (NeedleError, ValueError)):
                raise RequestError(400, f"{exc}", param="messages")
            if exc is not None:
                raise exc
            if event["error_code"] == "max_new_tokens":   # the call did not fit in max_tokens
                return Outcome(finish="length", reasoning=event["response"].get("reasoning") or "")
            raise RequestError(500, f"the turn failed: {event['error']}", code=event["error_code"])
        envelope = event["response"]
        calls = list(envelope["function_calls"])
        if forced:
            calls += envelope["suppressed_calls"]
        timings = envelope["timings"]
        ids = agent.conversation_ids()
        # cached_tokens: the prompt tokens this request did not compute -- a resumed
        # conversation, or a new conversation's tool block; 0 for a conversation put in
        # again turn by turn (how much of its tool block was ready is not seen here)
        if before:
            prompt = before + timings["n_prefill"]
            cached = len(snapshot.ids) if snapshot is not None else 0
        else:
            # the tool block ends at the first </tools> marker
            prefix = ids.index(self._tools_end) + 1 if self._tools_end in ids else 0
            prompt = prefix + timings["n_prefill"]
            cached = prefix - timings["n_prefix"]       # n_prefix: prefix tokens prefilled now
        finished = Turn(req.final.text, req.final.is_results, calls)
        self._store_conversation((slot.key, conversation_keys(req.history + [finished])[-1]),
                                 agent.snapshot())
        if calls:
            finish = "tool_calls"
        else:
            finish = "length" if envelope["stop_reason"] == "max_new_tokens" else "stop"
        return Outcome(calls=calls, reasoning=envelope.get("reasoning") or "", finish=finish,
                       prompt_tokens=prompt, completion_tokens=len(ids) - prompt, cached_tokens=cached,
                       prefill_s=timings["prefix_s"] + timings["prefill_s"],
                       decode_s=timings["reasoning_s"] + timings["constrained_s"])
