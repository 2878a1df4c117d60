"""The response envelope of ``Needle.complete`` / ``Needle.run`` as typed dicts.

Every turn's envelope has every key of ``Response`` (errors included: nothing decoded
then, ``function_calls`` empty, the numbers 0).  ``run()`` adds the keys of
``RunResponse``.  docs/api.md's "The response envelope" section lists the same fields.
"""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict

__all__ = ["Call", "Validation", "Timings", "Response", "ExecutedCall", "RunResponse",
           "ResponseType", "StopReason", "LoopStop", "CallStatus"]

ResponseType = Literal["call", "refusal", "respond", "error"]
"""``call``: the turn made calls (in ``function_calls``, or all held back in
``suppressed_calls``); ``refusal``: a request answered with no call; ``respond``: the turn
after tool results made no further call (the loop is finished); ``error``: ``success`` is
false."""

StopReason = Literal["call", "refusal", "reasoning_limit", "max_new_tokens", "invalid_output",
                     "grammar_dead_end", "cancelled", "context_overflow"]
"""Why decoding stopped: ``call`` (a complete call array with calls), ``refusal`` (``[]``,
``<|im_end|>`` or EOS), ``reasoning_limit`` (the reasoning cap: a decline), and the error
codes ``max_new_tokens``, ``invalid_output``, ``grammar_dead_end``, ``cancelled``,
``context_overflow`` (from ``run()``).  (The ``error`` event of ``stream()`` for an
exception that ``complete()`` raises carries the exception's class name instead.)"""

LoopStop = Literal["no_calls", "max_steps", "repeated_calls", "not_executable", "error"]
"""Why ``run()`` stopped looping."""

CallStatus = Literal["ok", "error", "timeout", "cancelled"]


class Call(TypedDict):
    name: str
    arguments: Dict[str, Any]


class Validation(TypedDict):
    negation: bool          # a call the request negates held the turn back


class Timings(TypedDict):
    total_s: float
    prefix_s: float          # prefilling the system + tools prefix (0 when it was cached)
    prefill_s: float         # prefilling the turn's own tokens
    reasoning_s: float
    constrained_s: float     # the call block (grammar_s is part of it)
    grammar_s: float
    n_backtracks: int        # grammar dead ends recovered from (should stay 0)
    n_prefill: int
    n_reasoning: int
    n_constrained: int
    n_prefix: int
    n_prefix_reused: int     # prefix tokens resumed from a checkpoint


class Response(TypedDict):
    type: ResponseType
    success: bool
    error: Optional[str]                 # None when success
    error_code: Optional[str]            # None when success, else a StopReason error code
    function_calls: List[Call]           # the calls to execute (not the held-back ones)
    escalate: bool                       # some calls were held back
    suppressed_calls: List[Call]         # held back: low confidence or negated, not executed
    validation: Validation
    reasoning: str                       # the <think> text ("" when none)
    confidence: Optional[float]          # None when neither a head nor call tokens exist
    call_confidences: List[Optional[float]]   # per call of function_calls + suppressed_calls
    prefill_tps: float
    decode_tps: float
    peak_ram_mb: float
    stop_reason: StopReason
    tools: List[str]                     # the tools the prompt held ([] for an early error)
    timings: Timings


class ExecutedCall(TypedDict):
    name: str
    arguments: Dict[str, Any]
    result: Any                          # what the function returned, or {"error": message}
    status: CallStatus
    step: int                            # 1 for the calls of the first turn, …


class RunResponse(Response, total=False):
    results: List[Any]                   # always: the executed results, in order
    executed_calls: List[ExecutedCall]   # always: each executed call beside its result
    steps: int                           # always: turns whose calls were executed
    loop_stop: LoopStop                  # always
    max_steps_reached: bool              # only when loop_stop is "max_steps"
    repeated_calls: bool                 # only when loop_stop is "repeated_calls"
    unexecuted_reason: str               # only when loop_stop is "not_executable"
    results_cut: int                     # only when results were cut to fit the context
