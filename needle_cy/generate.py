"""One assistant turn: greedy reasoning, then grammar-constrained tool calls (spec §8.1).

The decoder talks to three small protocols so that tests can drive it with scripted
logits:

* a **model** with ``prefill(ids) -> logits``, ``step(token) -> logits``, ``position``,
  ``config.max_seq_len`` and optionally ``head_outputs()`` (``needle_cy.model.Model``);
* a **tokenizer** with ``marker_id``, ``eos_id``, ``encode(text, dummy_prefix=)``,
  ``piece_bytes(id)`` and ``stream_decoder()`` (``needle_cy.tokenizer.Tokenizer``);
* a **grammar** with ``start()`` and ``best_allowed(state, logits, piece_table,
  close_string)`` (``needle_cy.grammar``), states with ``feed``, ``is_complete`` and
  ``in_string``.

Phases of a turn:

1. *prefill* the turn's new ids (in chunks, so a cancel is seen between chunks);
2. *reasoning*: greedy over the whole output vocabulary (with a ``note_grounder``, the
   quotes of the ``<think>`` notes are copied from what was said) until ``<tool_call>`` (fed, then
   phase 3), ``<|im_end|>``/EOS (the empty call ``[]``), the reasoning cap or
   ``max_new_tokens`` (a decline: ``[]`` with ``stop_reason`` saying why);
3. *constrained*: the grammar's best allowed token over the whole vocabulary until the
   call array is complete, then ``</tool_call><|im_end|>`` are appended.  After
   ``string_token_cap`` tokens inside one free string value only closing it is allowed.
   With a ``grounder`` (``needle_cy.grounding``) the token is the best one the grammar
   allows *and* grounding accepts, else the grammar's best (grounding never strands).
   ``force_call`` enters phase 3 where the model would stop or decline; ``require_call``
   does too and turns down the tokens that would close the list empty, so the turn
   calls a tool (the model's choice among the allowed calls, e.g. to measure tool
   choice apart from the decision to call).  With a ``name_prior`` (``needle_cy.name_prior.NamePrior``) the
   tokens that write a call's tool name are re-weighted by a prior over the tools (a
   product of experts; it only moves the choice among the tokens the grammar allows).

Confidence (documented choice, spec §5.4): ``min(sigmoid(confidence-head logit over
prompt + call), min over call tokens of the chosen token's full-softmax probability)``.
The call tokens run from ``<tool_call>`` to the last JSON byte; the probability is taken
from the model's unmasked distribution (a grammar-forced token the model found unlikely
lowers the confidence, which is the point; inside a grounded string, and at a step where
grounding turned down an unsaid optional key, see ``_grounded_choice``).  Either term
alone when the other does not exist (no confidence head / no call tokens); ``None`` only
when neither exists.

Events (dicts with ``type``), in order: ``thinking_start``, ``thinking_delta`` (``delta``
text), ``thinking_end`` (``content``) when the model writes ``<think>``; then per call
``toolcall_start`` (``index``), ``toolcall_delta`` (``index``, ``delta``: the call's JSON
text as it is written), ``toolcall_end`` (``index``, ``call``: the parsed call, available
before the rest of the array is decoded), and — only if the grammar reached a dead end
and tokens were taken back — ``toolcall_rewind`` (``index``, ``text``: that call's JSON
text is now ``text``; a call whose start was taken back starts again with the same
index).  A refusal or decline has no toolcall events.

``run_turn`` is a generator: it yields event dicts and *returns* a ``TurnResult``.  The
caller (the agent) owns the model snapshot and rolls back on error or cancellation.
"""
from __future__ import annotations

import codecs
import json
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .errors import ContextOverflowError

__all__ = ["DecodeSettings", "TurnResult", "Cancelled", "run_turn", "parse_completion",
           "sigmoid"]

PREFILL_CHUNK = 64          # tokens per prefill call: the cancellation granularity of prefill
CLOSING_RESERVE = 12        # context kept free for the tokens that close a turn


class Cancelled(Exception):
    """Raised inside ``run_turn`` when the cancel flag is seen."""

    def __init__(self, phase):
        super().__init__(f"cancelled during {phase}")
        self.phase = phase


@dataclass
class DecodeSettings:
    max_new_tokens: int = 512
    reasoning_limit: int = 256       # tokens before <tool_call>; then the turn declines
    string_token_cap: int = 64       # tokens inside one free string value; then close it
    constrained: bool = True
    force_call: bool = False         # enter <tool_call> even when the model stops or declines
    require_call: bool = False       # force_call, and the call list holds at least one call
    ground_values: bool = True       # string values from what was said (needle_cy.grounding)
    ground_notes: bool = True        # quotes of the <think> notes too (NoteGrounder)


@dataclass
class TurnResult:
    calls: list = field(default_factory=list)
    reasoning: str = ""
    stop_reason: str = "call"      # call | refusal | reasoning_limit | max_new_tokens | invalid_output
    error: Optional[str] = None
    error_code: Optional[str] = None
    confidence: Optional[float] = None
    head_confidence: Optional[float] = None
    min_token_prob: Optional[float] = None
    call_confidences: list = field(default_factory=list)   # per call, see _finish_confidence
    assistant_ids: list = field(default_factory=list)   # ids now in the model state
    raw_call_text: str = ""
    n_prefill: int = 0
    n_generated: int = 0
    n_reasoning: int = 0
    n_constrained: int = 0
    prefill_s: float = 0.0
    reasoning_s: float = 0.0
    constrained_s: float = 0.0
    grammar_s: float = 0.0
    n_backtracks: int = 0       # grammar dead ends recovered from (should stay 0)

    @property
    def success(self):
        return self.error is None


def sigmoid(x):
    x = float(x)
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def token_probability(logits, token):
    """Full-softmax probability of ``token`` (float64 log-sum-exp for stability)."""
    row = np.asarray(logits, dtype=np.float64)
    top = row.max()
    return float(math.exp(row[token] - top) / np.exp(row - top).sum())


class _Ids:
    """The special ids the decoder reacts to, looked up once per tokenizer."""

    def __init__(self, tokenizer):
        self.tool_call = tokenizer.marker_id("<tool_call>")
        self.tool_call_end = tokenizer.marker_id("</tool_call>")
        self.im_end = tokenizer.marker_id("<|im_end|>")
        self.think = tokenizer.marker_id("<think>")
        self.think_end = tokenizer.marker_id("</think>")
        self.eos = tokenizer.eos_id


def parse_completion(text):
    """(reasoning, call_body or None) from decoded assistant text (package semantics:
    no ``<tool_call>`` → no call body)."""
    reasoning = text
    body = None
    if "<tool_call>" in text:
        reasoning, _, rest = text.partition("<tool_call>")
        body = rest.split("</tool_call>", 1)[0]
    if "<think>" in reasoning:
        reasoning = reasoning.split("<think>", 1)[1]
    reasoning = reasoning.split("</think>", 1)[0]
    return reasoning.replace("<|im_end|>", "").strip(), body


def _dedupe(calls):
    """Indices of the calls kept when exact repeats (same name and arguments) are
    dropped, keeping the first."""
    seen, out = set(), []
    for i, call in enumerate(calls):
        key = json.dumps(call, sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            out.append(i)
    return out


class CallSplitter:
    """Splits the call array's bytes into per-call events as they stream.

    Tracks JSON nesting (strings and escapes respected): a call starts at a ``{`` at
    array depth 1 and ends at its matching ``}``.  ``feed(bytes)`` returns the events
    this chunk completes: ``toolcall_start``/``toolcall_delta``/``toolcall_end`` with the
    call ``index``; ``toolcall_end`` carries the parsed ``call`` (None if unparsable)."""

    def __init__(self):
        self.depth = 0
        self.in_string = self.escape = False
        self.index = -1
        self.buf = bytearray()
        self.decoder = None

    def feed(self, data: bytes) -> list:
        events, pending = [], bytearray()

        def flush():
            if pending and self.decoder is not None:
                text = self.decoder.decode(bytes(pending))
                if text:
                    events.append({"type": "toolcall_delta", "index": self.index, "delta": text})
            pending.clear()

        for b in data:
            inside = self.depth >= 2
            if self.in_string:
                if inside:
                    pending.append(b)
                    self.buf.append(b)
                if self.escape:
                    self.escape = False
                elif b == 0x5C:
                    self.escape = True
                elif b == 0x22:
                    self.in_string = False
                continue
            if b == 0x22:
                self.in_string = True
            elif b in (0x7B, 0x5B):                      # { [
                self.depth += 1
                if self.depth == 2:
                    self.index += 1
                    self.buf = bytearray()
                    self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
                    events.append({"type": "toolcall_start", "index": self.index})
            elif b in (0x7D, 0x5D):                      # } ]
                if self.depth >= 2:
                    pending.append(b)
                    self.buf.append(b)
                self.depth -= 1
                if self.depth == 1:
                    flush()
                    try:
                        call = json.loads(self.buf.decode("utf-8"))
                    except ValueError:
                        call = None
                    events.append({"type": "toolcall_end", "index": self.index, "call": call})
                    self.decoder = None
                continue
            if self.depth >= 2:
                pending.append(b)
                self.buf.append(b)
        flush()
        return events


def run_turn(model, tokenizer, grammar, new_ids, settings: DecodeSettings, piece_table,
             cancel=None, ids=None, clock=time.perf_counter, grounder=None, note_grounder=None,
             name_prior=None):
    """Generator: yields events, returns a TurnResult.  See the module docstring.

    ``grounder``: a fresh ``needle_cy.grounding.ValueGrounder`` for this turn's call block,
    or None; used only when ``settings.constrained`` and ``settings.ground_values``.
    ``note_grounder``: a fresh ``needle_cy.grounding.NoteGrounder`` for the ``<think>``
    text, or None; used only when ``settings.ground_notes``.  ``name_prior``: a fresh
    ``NamePrior`` for this turn's tool names, or None; used only when
    ``settings.constrained``."""
    if settings.require_call and not settings.constrained:
        raise ValueError("require_call needs constrained decoding (constrained=True): free "
                         "decoding cannot keep the model from writing []")
    ids = ids or _Ids(tokenizer)
    res = TurnResult()
    if not settings.ground_notes:
        note_grounder = None
    if not settings.constrained:
        name_prior = None
    notes_prior = name_prior if name_prior is not None and name_prior.notes else None
    cancelled = (lambda: cancel.is_set()) if cancel is not None else (lambda: False)

    max_seq = int(getattr(model.config, "max_seq_len", 1 << 30))
    room = max_seq - model.position - len(new_ids) - CLOSING_RESERVE
    if room < 4:
        raise ContextOverflowError(
            f"the conversation needs {model.position + len(new_ids)} tokens plus room to answer, "
            f"but the model's context is {max_seq} tokens; shorten the request or start a new "
            f"conversation")
    budget = min(settings.max_new_tokens, room)

    # --- 1. prefill -------------------------------------------------------------
    t0 = clock()
    logits = None
    for i in range(0, len(new_ids), PREFILL_CHUNK):
        if cancelled():
            raise Cancelled("prefill")
        logits = model.prefill(list(new_ids[i:i + PREFILL_CHUNK]))
    res.prefill_s = clock() - t0
    res.n_prefill = len(new_ids)
    if logits is None:
        raise ValueError("run_turn needs at least one new token to prefill")

    # --- 2. reasoning -----------------------------------------------------------
    generated = []            # every id chosen this turn, in order
    probs = []                # chosen-token probabilities from <tool_call> on
    in_think = think_done = False
    think_decoder = tokenizer.stream_decoder()
    reasoning_parts = []
    t0 = clock()
    stop = None
    while True:
        if cancelled():
            raise Cancelled("reasoning")
        if len(generated) >= budget:
            stop = "max_new_tokens"
            break
        if len(generated) >= settings.reasoning_limit:
            stop = "reasoning_limit"
            break
        if note_grounder is not None and in_think:
            token = _grounded_note_token(logits, note_grounder, piece_table)
        else:
            token = int(np.argmax(logits))
        if notes_prior is not None and in_think:
            token = notes_prior.note_token(token, logits, piece_table)
        if token == ids.tool_call:
            probs.append(token_probability(logits, token))
            generated.append(token)
            stop = "tool_call"
            break
        if token in (ids.im_end, ids.eos):
            stop = "refusal"
            break
        generated.append(token)
        if token == ids.think and not in_think and not think_done:
            in_think = True
            think_decoder.flush()
            reasoning_parts = []          # text before <think> is not reasoning
            if notes_prior is not None:
                notes_prior.start_notes()
            yield {"type": "thinking_start"}
        elif token == ids.think_end and in_think:
            in_think, think_done = False, True
            tail = think_decoder.flush()
            if tail:
                reasoning_parts.append(tail)
                yield {"type": "thinking_delta", "delta": tail}
            yield {"type": "thinking_end", "content": "".join(reasoning_parts).strip()}
        elif token in (ids.think, ids.think_end):
            # A stray think marker is structure, not reasoning text: dropped by id, so the
            # text "<think>" the model copies from a request stays visible.
            pass
        elif in_think:
            if note_grounder is not None:
                note_grounder.feed(piece_table[token] or b"")
            if notes_prior is not None:
                notes_prior.feed_note(piece_table[token] or b"")
            delta = think_decoder.push(token)
            if delta:
                reasoning_parts.append(delta)
                yield {"type": "thinking_delta", "delta": delta}
        else:
            reasoning_parts.append(think_decoder.push(token))
        logits = model.step(token)
    res.reasoning_s = clock() - t0
    res.n_reasoning = len(generated)
    if in_think:
        tail = think_decoder.flush()
        if tail:
            reasoning_parts.append(tail)
            yield {"type": "thinking_delta", "delta": tail}
        yield {"type": "thinking_end", "content": "".join(reasoning_parts).strip()}
    else:
        reasoning_parts.append(think_decoder.flush())
    res.reasoning = "".join(reasoning_parts).strip()

    enter = settings.force_call or settings.require_call
    if stop in ("refusal", "reasoning_limit") and enter and len(generated) < budget:
        # Forced entry into the call block: close an open <think> first, then <tool_call>.
        newline = list(tokenizer.encode("\n", dummy_prefix=False))
        forced = newline + [ids.think_end] + newline if in_think else []
        if not forced:
            probs.append(token_probability(logits, ids.tool_call))
        if forced:
            model.prefill(forced)
        generated.extend(forced + [ids.tool_call])
        stop = "tool_call"

    if stop != "tool_call":
        # Decline or refusal: close the assistant turn so the conversation stays well formed.
        closing = []
        if stop != "refusal":
            if in_think:         # "\n</think>\n", the marker by id
                newline = list(tokenizer.encode("\n", dummy_prefix=False))
                closing = newline + [ids.think_end] + newline
            closing += [ids.tool_call] + list(tokenizer.encode("[]", dummy_prefix=False)) + [ids.tool_call_end]
        closing.append(ids.im_end)
        model.prefill(closing)        # every generated reasoning token is already fed
        res.assistant_ids = generated + closing
        res.n_generated = len(generated)
        res.stop_reason = stop
        _finish_confidence(model, res, probs)
        return res

    # --- 3. the call block ----------------------------------------------------
    logits = model.step(ids.tool_call)
    call_start = len(generated)
    t0 = clock()
    splitter = CallSplitter()
    call_bytes = bytearray()
    grammar_s = 0.0
    call_ends = []                      # len(probs) when each call's closing brace was written
    if settings.constrained:
        state = grammar.start()
        string_run = 0
        complete = False
        # Per call position i: the grammar state, logits and string run *before* token i,
        # kept so that a grammar dead end can take tokens back (see _backtrack).
        tokens, states, logits_at, runs = [], [], [], []
        banned = {}
        locked = 0                      # positions before this belong to finished calls
        if not settings.ground_values:
            grounder = None
        if grounder is not None:
            grounder.reset()
        if name_prior is not None:
            name_prior.reset()
        probs_base = len(probs)
        snap0 = model.snapshot() if hasattr(model, "snapshot") else None
        while True:
            if cancelled():
                raise Cancelled("constrained decoding")
            if len(generated) >= budget:
                break
            close = settings.string_token_cap > 0 and string_run >= settings.string_token_cap
            g0 = clock()
            choice_logits = logits
            for _ in range(_EMPTY_LIST_TRIES):
                token, new_state, prob_row = _choose(grammar, state, choice_logits, piece_table,
                                                     close, grounder, name_prior)
                # require_call: a token that completes the list before any call began
                # closes it empty ("]", "[]"); the model's next best token is taken instead
                if not (settings.require_call and splitter.index < 0 and token >= 0
                        and new_state.is_complete()):
                    break
                choice_logits = np.array(choice_logits, dtype=np.float32, copy=True)
                choice_logits[token] = _MASKED
            if prob_row is choice_logits:
                prob_row = logits      # the confidence reads the model's own distribution
            grammar_s += clock() - g0
            if token < 0:
                # A state with no allowed token should not exist; recover by taking tokens
                # back to the nearest position with an untried alternative (bounded).
                g0 = clock()
                alt = _backtrack(grammar, piece_table, tokens, states, logits_at, banned, locked,
                                 res) if snap0 is not None else None
                grammar_s += clock() - g0
                if alt is None:
                    res.error = (f"the grammar allows no token after {bytes(call_bytes)!r} (a dead "
                                 f"end: a needle_cy.grammar bug)")
                    res.error_code = "grammar_dead_end"
                    break
                j, token, new_state = alt
                prob_row = logits_at[j]
                state, logits, string_run = states[j], logits_at[j], runs[j]
                del tokens[j:], states[j:], logits_at[j:], runs[j:]
                del probs[probs_base + j:], generated[call_start + j:]
                call_bytes = bytearray(b"".join(piece_table[t] for t in tokens))
                if grounder is not None:
                    grounder.reset()
                    grounder.feed(bytes(call_bytes))
                if name_prior is not None:
                    name_prior.reset()
                    name_prior.feed(bytes(call_bytes))
                open_index = splitter.index
                splitter = CallSplitter()
                splitter.feed(bytes(call_bytes))
                text = (splitter.buf.decode("utf-8", "replace") if splitter.depth >= 2
                        and splitter.index == open_index else "")
                yield {"type": "toolcall_rewind", "index": open_index, "text": text}
                model.restore(snap0)
                if tokens:
                    model.prefill(list(tokens))
            tokens.append(token)
            states.append(state)
            logits_at.append(np.array(logits, dtype=np.float32, copy=True))
            runs.append(string_run)
            probs.append(1.0 if prob_row is None else token_probability(prob_row, token))
            generated.append(token)
            piece = piece_table[token]
            call_bytes += piece
            if grounder is not None:
                grounder.feed(piece)
            if name_prior is not None:
                name_prior.feed(piece)
            for event in splitter.feed(piece):
                if event["type"] == "toolcall_end":
                    locked = len(tokens)
                    call_ends.append(len(probs))
                yield event
            state = new_state
            string_run = string_run + 1 if state.in_string() else 0
            if state.is_complete():
                complete = True
                break
            logits = model.step(token)
        res.constrained_s = clock() - t0
        res.grammar_s = grammar_s
        res.n_constrained = len(generated) - call_start
        res.n_generated = len(generated)
        res.raw_call_text = call_bytes.decode("utf-8", "replace")
        if not complete:
            if res.error is None:
                res.error = (f"max_new_tokens ({settings.max_new_tokens}) or the context ran out "
                             f"before the tool call was complete")
                res.error_code = "max_new_tokens"
            res.stop_reason = res.error_code
            return res
        try:
            calls = json.loads(res.raw_call_text)
        except ValueError as exc:   # the grammar guarantees JSON; keep the guard loud
            res.error = f"constrained output is not JSON ({exc}): {res.raw_call_text!r}"
            res.error_code = "invalid_output"
            res.stop_reason = "invalid_output"
            return res
        closing = [ids.tool_call_end, ids.im_end]
        model.prefill([generated[-1]] + closing)   # the last call token is not fed yet
    else:
        # Free decoding (for comparison): greedy until </tool_call>, <|im_end|> or EOS.
        end = None
        while True:
            if cancelled():
                raise Cancelled("constrained decoding")
            if len(generated) >= budget:
                break
            token = int(np.argmax(logits))
            if token in (ids.tool_call_end, ids.im_end, ids.eos):
                end = token
                break
            probs.append(token_probability(logits, token))
            generated.append(token)
            piece = tokenizer.piece_bytes(token)
            call_bytes += piece
            yield from splitter.feed(piece)
            logits = model.step(token)
        res.constrained_s = clock() - t0
        res.n_constrained = len(generated) - call_start
        res.n_generated = len(generated)
        res.raw_call_text = call_bytes.decode("utf-8", "replace")
        calls, problem = _check_free_output(grammar, bytes(call_bytes), end is not None)
        if problem is not None:
            res.error = f"model output is not a valid call: {problem}"
            res.error_code = "invalid_output"
            res.stop_reason = "invalid_output"
            return res
        closing = [ids.tool_call_end, ids.im_end]
        model.prefill(closing)        # free decoding fed every token already

    res.assistant_ids = generated + closing
    kept = _dedupe(calls)
    res.calls = [calls[i] for i in kept]
    res.stop_reason = "call" if res.calls else "refusal"
    _finish_confidence(model, res, probs,
                       [call_ends[i] for i in kept] if len(call_ends) == len(calls) else None)
    return res


MAX_DEAD_ENDS = 24
GROUNDED_TRIES = 16         # grammar-allowed tokens grounding may turn down in one step
_EMPTY_LIST_TRIES = 8       # require_call: tokens that close an empty list turned down in one step
_MASKED = np.float32(-1e30)


def _choose(grammar, state, logits, piece_table, close, grounder, name_prior=None):
    """(token, state, probability row) of one constrained step: the grounded choice when
    there is one, else the grammar's best allowed token (token -1 when none is).  With a
    ``name_prior`` both choose from the logits it shifted (``NamePrior.biased``); the
    probability row stays the model's own, so a name the prior chose against the
    model's wish keeps its low probability and, with a confidence head, such a call is
    held back rather than run."""
    scores = logits if name_prior is None else name_prior.biased(logits, piece_table)
    token, new_state, prob_row = -1, None, scores
    if grounder is not None:
        token, new_state, prob_row = _grounded_choice(grammar, state, scores, piece_table,
                                                      close, grounder)
    if token < 0:             # no grounder, or nothing grounded fits: the grammar alone
        prob_row = scores
        token, new_state = grammar.best_allowed(state, scores, piece_table, close_string=close)
    if token < 0 and close:   # cannot close right here (e.g. mid-escape): continue it
        token, new_state = grammar.best_allowed(state, scores, piece_table, close_string=False)
    if prob_row is scores:
        prob_row = logits
    return token, new_state, prob_row


def _grounded_choice(grammar, state, logits, piece_table, close, grounder):
    """(token, state, probability row) of the model's best token that the grammar allows
    and grounding accepts, or (-1, None, None) when there is none (the caller then uses
    the grammar alone).

    Inside a grounded string the probability row is the model's distribution over the
    proposed continuations only: the confidence then asks how sure the model is of *which*
    span it copies, not how much it wanted to write something unsaid (a small model's
    unmasked mass inside a string sits on invented words).  The row is None when grounding
    turned down an optional key nobody said (``,"quantity"`` for "add butter"): leaving an
    argument to the tool's default is grounding's decision, so that step does not count
    in the token term of the confidence (the head still judges the call)."""
    cand = grounder.candidates()
    if cand is not None:
        if not cand:
            return -1, None, None
        idx = np.fromiter(cand, dtype=np.int64, count=len(cand))
        idx = idx[idx < len(logits)]
        scores = np.full(len(logits), _MASKED, dtype=np.float32)
        scores[idx] = np.asarray(logits, dtype=np.float32)[idx]
    else:
        scores = logits
    prob_row = scores if cand is not None else logits
    copied = cand is not None
    key_refused = False
    for _ in range(GROUNDED_TRIES):
        token, new_state = grammar.best_allowed(state, scores, piece_table, close_string=close)
        if token < 0 or scores[token] <= -1e29:
            return -1, None, None
        if grounder.accepts(piece_table[token]):
            return token, new_state, None if key_refused else prob_row
        key_refused = key_refused or grounder.refuses_key(piece_table[token])
        if not copied:
            scores = np.array(scores, dtype=np.float32, copy=True)
            copied = True
        scores[token] = _MASKED
    return -1, None, None


def _grounded_note_token(logits, grounder, piece_table):
    """The model's best token among the note grounder's proposals that it accepts, else
    the plain best token (reasoning grounding, like the call block's, never strands)."""
    cand = grounder.candidates()
    if cand:
        row = np.asarray(logits, dtype=np.float32)
        idx = np.fromiter(cand, dtype=np.int64, count=len(cand))
        idx = idx[idx < len(row)]
        for t in idx[np.argsort(-row[idx], kind="stable")][:GROUNDED_TRIES]:
            if grounder.accepts(piece_table[int(t)]):
                return int(t)
    return int(np.argmax(logits))


def _backtrack(grammar, piece_table, tokens, states, logits_at, banned, locked, res):
    """(position, token, state) to resume from after a grammar dead end, or None.

    The k-th dead end of a turn takes back 2^(k-1) tokens (never into a finished call),
    bans the token that was taken at the landing position and picks the best other allowed
    token there (moving further back when none is left).  The doubling leaves a wide dead
    region (e.g. a run of escape hex digits) in a few steps instead of enumerating it."""
    res.n_backtracks += 1
    if res.n_backtracks > MAX_DEAD_ENDS:
        return None
    j = max(locked, len(tokens) - (1 << min(res.n_backtracks - 1, 30)))
    while locked <= j < len(tokens):
        ban = banned.setdefault(j, set())
        ban.add(tokens[j])
        masked = logits_at[j].copy()
        masked[list(ban)] = -1e30
        token, state = grammar.best_allowed(states[j], masked, piece_table, close_string=False)
        if token >= 0 and token not in ban:
            for k in [k for k in banned if k > j]:
                del banned[k]
            return j, token, state
        del banned[j]            # nothing else fits here: change an earlier position
        j -= 1
    return None


def _check_free_output(grammar, body: bytes, closed: bool):
    """(calls, None) when ``body`` is a complete sentence of the grammar, else (None, why)."""
    if not closed:
        return None, "generation stopped before </tool_call>"
    state = grammar.start()
    if not state.feed(body):
        return None, f"{body.decode('utf-8', 'replace')!r} does not match the tool schemas"
    if not state.is_complete():
        return None, f"{body.decode('utf-8', 'replace')!r} is an incomplete call"
    try:
        return json.loads(body.decode("utf-8")), None
    except ValueError as exc:
        return None, f"not JSON ({exc})"


def _finish_confidence(model, res: TurnResult, probs, call_ends=None):
    """The turn's confidence and, per call, the confidence of the calls up to it.

    Call k's confidence is the same minimum taken over the tokens from ``<tool_call>``
    through call k's closing brace (so it includes the separator that asked for call k),
    the last call's over every call token: non-increasing along the calls, and the last
    equals the turn's.  A call the model barely wanted to add after confident ones
    ("lock the back door" + a notification nobody asked for) then has its own low value,
    and the agent can hold back that call and the ones after it alone.  Without call
    boundaries (free decoding) every call gets the turn's confidence."""
    head = None
    outputs = model.head_outputs() if hasattr(model, "head_outputs") else {}
    if outputs and outputs.get("confidence") is not None:
        head = sigmoid(np.asarray(outputs["confidence"]).reshape(-1)[0])
    res.head_confidence = head
    res.min_token_prob = min(probs) if probs else None
    terms = [v for v in (head, res.min_token_prob) if v is not None]
    res.confidence = min(terms) if terms else None
    res.call_confidences = [res.confidence] * len(res.calls)
    if call_ends and res.confidence is not None:
        for k, end in enumerate(call_ends[:-1]):
            part = [v for v in (head, min(probs[:end]) if end else None) if v is not None]
            res.call_confidences[k] = min(part) if part else None
