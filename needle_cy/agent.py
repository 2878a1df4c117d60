"""``Needle``: request text + tools → schema-valid tool calls, turn by turn.

    from needle_cy import Needle, tool

    @tool
    def set_light(room: str, on: bool):
        "Turn the lights in a room on or off."

    agent = Needle(tools=[set_light])      # the embedded default model
    print(agent.run("turn on the kitchen light")["results"])

A conversation is the trained template (``needle_cy.prompt``): the BOS + system + tools
prefix is prefilled once per tool selection and kept as a model snapshot (prefix KV
caching); every turn prefills only its new tokens, and ``reset()`` rewinds to the prefix.
A new tool selection starts from the longest already-prefilled run of its tokens
(``_PrefixCheckpoints``): the tools are rendered in catalogue order, so selections share
their leading tools (on the dev set's stream of requests, about a third of the prefix
tokens come from a checkpoint with the default 32 MB; benchmarks/history/accuracy.md).
Which tools the prefix holds is decided at the first turn of a conversation by
``needle_cy.retrieval`` and stays fixed for that conversation.
"""
from __future__ import annotations

import dataclasses
import json
import operator
import os
import resource
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from .envelope import Response, RunResponse
from .errors import ContextOverflowError, ModelNotAvailableError, NeedleError
from .generate import CLOSING_RESERVE, Cancelled, DecodeSettings, run_turn
from .name_prior import NamePrior
from .grounding import GroundingIndex, NoteGrounder, ValueGrounder
from .hub import resolve_model
from .negation import negated_calls
from .prompt import (BOS_ID, IM_END, TOOL_CALL, TOOL_CALL_END, Conversation, OutsideText, compact_json,
                     encode_template, render_tools_json, with_date_fact)
from .retrieval import (EmbeddingRanker, QueryExpansion, bm25_index, default_query_expansion,
                        file_fingerprint, clause_picks, name_prior, rank_bm25, request_clauses,
                        select_prefix)
from .toolspec import ToolSpec, home_tools, normalize_tool, normalize_tools

__all__ = ["Needle", "ConversationSnapshot", "extract", "DEFAULT_MODEL_PATH"]

# A model: a .cact path, a folder holding one, a Hugging Face id, an Archive or a loaded
# Model, or None for the embedded default.
ModelSource = Union[str, "os.PathLike[str]", Any, None]
# A turn: the request text, or the tool results of the last turn's calls (a list, or
# their JSON text).
TurnInput = Union[str, Sequence[Any]]

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "models" / "default.cact"
_PREFIX_CACHE_SIZE = 4
_PREFILL_CHUNK = 64       # prefix tokens per prefill call; checkpoints sit at its multiples
_TOOL_POLL_S = 0.02       # how often a wait on a running tool looks at cancel() and the timeout
_ANSWER_ROOM = 48         # tokens a tool-result turn leaves the model to answer (at most max_new_tokens)


def _peak_ram_mb():
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _Prefix:
    """One cached tool selection: its conversation template, grammar and model snapshot."""

    def __init__(self, names, specs, conversation, grammar):
        self.names = names
        self.specs = specs
        self.conversation = conversation
        self.grammar = grammar
        self.snapshot = None
        self.reused = 0          # prefix tokens its last prefill resumed from a checkpoint


class _PrefixCheckpoints:
    """Model snapshots taken at every ``_PREFILL_CHUNK`` boundary of the prefixes prefilled
    so far, keyed by the token ids before the boundary.  Restoring one and prefilling the
    rest in the same aligned chunks computes exactly what a prefill from position 0
    computes.

    Beyond ``max_bytes`` the deepest checkpoint goes first (the least recently used among
    equally deep ones): shallow runs are shared by many tool selections and cost less, so
    keeping them serves more tokens per byte (on the dev set's stream, more prefix tokens
    came from checkpoints than with plain LRU at every budget tried)."""

    def __init__(self, max_bytes):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self._snaps = OrderedDict()      # ids tuple → (snapshot, bytes)

    def __len__(self):
        return len(self._snaps)

    def longest(self, ids):
        """(n, snapshot) for the longest cached run ``ids[:n]``, or (0, None)."""
        for n in range(len(ids) // _PREFILL_CHUNK * _PREFILL_CHUNK, 0, -_PREFILL_CHUNK):
            key = tuple(ids[:n])
            hit = self._snaps.get(key)
            if hit is not None:
                self._snaps.move_to_end(key)
                return n, hit[0]
        return 0, None

    def add(self, ids, snap):
        key = tuple(ids)
        size = int(getattr(snap, "nbytes", 0))
        if key in self._snaps or not 0 < size <= self.max_bytes:
            return
        self._snaps[key] = (snap, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            victim = max(self._snaps, key=len)    # ties: the first, least recently used
            self.bytes -= self._snaps.pop(victim)[1]


@dataclasses.dataclass(frozen=True)
class ConversationSnapshot:
    """A conversation in progress, as ``Needle.snapshot()`` took it (opaque; restore it
    with ``Needle.restore``)."""

    agent: Any
    entry: Any                  # the conversation's _Prefix, or None before a first turn
    ids: tuple
    n_user_turns: int
    last_turn_had_calls: bool
    said: tuple
    turns: int
    model_state: Any

    @property
    def nbytes(self) -> int:
        """Bytes of the model state it holds (what keeping it costs)."""
        return int(getattr(self.model_state, "nbytes", 0)) if self.model_state is not None else 0


class Needle:
    """A tool-calling agent over one Needle archive and one tool set.

    Parameters follow the official ``needle.Needle`` where the concept is the same:

    model: path to a ``.cact`` archive, a folder holding one, a Hugging Face model id
        (``"org/name"`` or ``"org/name@revision"``, from the local Hugging Face cache first;
        ``needle_cy.hub``), an ``Archive``, a loaded ``Model``, or ``None`` for the embedded
        default model (``needle_cy/models/default.cact``).
    model_file: which ``.cact`` file of a folder or Hugging Face model (a relative path);
        by default the only one, else ``model.cact`` (``needle_cy.hub.pick_archive``).
    tools: functions (``@tool`` or plain), JSON-Schema dicts, JSON strings, pydantic models.
        Left out (``None``): with ``model=None`` the smart-home catalogue the embedded
        model was trained on (``needle_cy.home_tools()``); with any other model a
        ``ValueError``, since a model calls only the tools it is given.  ``tools=[]`` is
        allowed and declines every request.  The tools are checked here, before the model
        loads: a malformed definition or a keyword the grammar cannot enforce raises
        ``SchemaError`` / ``UnsupportedSchemaError`` naming the tool.
    strict: a keyword that looks like a misspelt JSON-Schema keyword (``"maximun"``) raises
        ``SchemaError`` instead of a ``SchemaWarning`` (``needle_cy.toolspec``).
    system: facts placed in the system block (``date: …; location: …``).
    auto_date: add today's ``date:`` fact as the official package does (spec §8.4); off
        by default so that prompts (and the prefix cache) are reproducible.
    max_calls_per_turn: the grammar allows at most this many calls in one turn.
    tool_token_budget / max_retrieved_tools / retrieval: tool selection (``bm25``,
        ``embedding`` or ``auto``), see ``needle_cy.retrieval``.
    tools_per_clause: the prompt holds only the best this many tools of each clause of
        the request (``retrieval.clause_picks``; at most ``max_retrieved_tools``), however
        short the catalogue: a model that chooses poorly among several tools does better
        among fewer (docs/api.md, tool retrieval).  When no tool shares a word with the
        request, the selection is as with ``None``.  A later turn whose best tools are not
        in the prompt moves the conversation onto a prompt that adds them (its turns
        prefilled again after the new tool list).  ``None`` (default; the embedded model chooses well among its own
        tools): the best ``max_retrieved_tools``, and every tool when they fit.
    name_prior: a weight α > 0: while a tool's name is written (in a call, and where a
        ``<think>`` note line begins one), the model's choice is multiplied by the BM25
        ranker's prior over the prompt's tools to the power α (``retrieval.name_prior``,
        ``name_prior.NamePrior``), a soft ``tools_per_clause``: every tool stays callable,
        and a model sure of its tool keeps it.  A turn that answers tool results, or that
        ``require_tool`` names the tool of, decodes without it.  ``None`` (default): off.
    query_expansion: with BM25 retrieval, words requests use for tools their schemas do
        not hold ("dim", "mute"): ``"default"`` (the shipped table, learned from the
        default model's training data), a path to such a table, a ``QueryExpansion``, or
        ``None`` (the request's own words only).
    reasoning_limit: tokens of free reasoning before a turn declines with ``[]``.
    constrained: ``False`` decodes the call freely and validates it afterwards.
    force_call: enter the call block even when the model stops or hits the reasoning cap
        (the grammar may still produce ``[]``); off by default.
    require_call: as ``force_call``, and the call list is never empty: the turn calls one
        of the selected tools, the one the model ranks first (constrained decoding only;
        ``complete(..., require_call=)`` sets it for one turn).
    tool_index_path: on-disk cache of tool embeddings (embedding retrieval).
    tokenizer: override (for a ``Model`` object without an archive).
    escalate_below: with a confidence head, the calls from the first one whose confidence
        (``call_confidences``: the turn's confidence over the tokens up to that call) is
        below this go to ``suppressed_calls`` (not executed by ``run``) with ``escalate:
        true``; ``None`` turns escalation off.
    negation_gate: calls the request negates ("Cancel my alarm" → ``set_alarm``, "don't
        open the blinds") are held back the same way, with ``validation.negation`` set
        (``needle_cy.negation``); ``False`` turns the gate off.
    ground_values: string arguments are spans of what was said and enum members it
        mentions, when the model has such a token among the grammar's (``needle_cy.grounding``).
    ground_notes: the quotes of the ``<think>`` notes likewise (``NoteGrounder``).
    prefix_checkpoint_mb: memory for model snapshots along prefilled prefixes, from which
        a new tool selection resumes at its longest already-prefilled run of tokens
        (``_PrefixCheckpoints``); 0 turns this off.
    """

    def __init__(self, model: ModelSource = None, tools: Any = None, system: Optional[str] = None,
                 max_calls_per_turn: int = 4, tool_token_budget: Optional[int] = None,
                 max_retrieved_tools: Optional[int] = 5, retrieval: str = "auto",
                 tools_per_clause: Optional[int] = None, name_prior: Optional[float] = None,
                 reasoning_limit: int = 256, constrained: bool = True, threads: Optional[int] = None,
                 backend: str = "cython", max_new_tokens: int = 512, string_token_cap: int = 64,
                 tool_index_path: Union[str, "os.PathLike[str]", None] = None,
                 tokenizer: Any = None, stateless: bool = False, force_call: bool = False,
                 auto_date: bool = False, escalate_below: Optional[float] = 0.1,
                 require_call: bool = False,
                 ground_values: bool = True, prefix_checkpoint_mb: float = 32,
                 query_expansion: Union[str, "os.PathLike[str]", QueryExpansion, None] = "default",
                 ground_notes: bool = True, negation_gate: bool = True,
                 model_file: Optional[str] = None, strict: bool = False) -> None:
        if require_call and not constrained:
            raise ValueError("require_call needs constrained decoding (constrained=True)")
        if retrieval not in ("auto", "bm25", "embedding"):
            raise ValueError(f"retrieval must be 'auto', 'bm25' or 'embedding', got {retrieval!r}")
        if int(max_calls_per_turn) < 1:
            raise ValueError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn!r}")
        if max_retrieved_tools is not None and int(max_retrieved_tools) < 1:
            raise ValueError(f"max_retrieved_tools must be >= 1 or None, got {max_retrieved_tools!r}")
        if tools_per_clause is not None and int(tools_per_clause) < 1:
            raise ValueError(f"tools_per_clause must be >= 1 or None, got {tools_per_clause!r}")
        if name_prior is not None and (isinstance(name_prior, bool)
                                       or not isinstance(name_prior, (int, float))
                                       or not 0 < name_prior < float("inf")):
            raise ValueError(f"name_prior must be a finite number > 0 (the prior's weight) or None "
                             f"(off), got {name_prior!r}")
        max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
        reasoning_limit = _int_at_least("reasoning_limit", reasoning_limit, 0)
        string_token_cap = _int_at_least("string_token_cap", string_token_cap, 0)
        if tools is None:
            if model is not None:
                raise ValueError(
                    "no tools given: pass tools=[...], the functions or JSON-Schema definitions "
                    "the model may call (needle_cy.home_tools() is the embedded model's "
                    "smart-home catalogue; tools=[] makes every request decline)")
            tools = home_tools()
        # Tools are checked before the model loads, so a bad schema fails fast.
        self.specs = normalize_tools(list(tools) if isinstance(tools, (list, tuple)) else tools,
                                     strict=strict)
        _check_grammars(self.specs)
        self.model, self.tokenizer, self.model_path = _load(model, backend, threads, tokenizer, model_file)
        self.tools = {s.name: s for s in self.specs}
        self.system = with_date_fact(system) if auto_date else system
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.tool_token_budget = tool_token_budget
        self.max_retrieved_tools = max_retrieved_tools
        self.tools_per_clause = None if tools_per_clause is None else int(tools_per_clause)
        self.name_prior = None if name_prior is None else float(name_prior)
        self._bm25 = None               # the catalogue's BM25 index (name_prior), built once
        self.retrieval = retrieval
        if isinstance(query_expansion, str) and query_expansion == "default":
            query_expansion = default_query_expansion()
        elif isinstance(query_expansion, (str, os.PathLike)):
            query_expansion = QueryExpansion.load(query_expansion)
        elif query_expansion is not None and not isinstance(query_expansion, QueryExpansion):
            raise ValueError(f"query_expansion must be 'default', a path, a QueryExpansion or None, "
                             f"got {type(query_expansion).__name__}")
        self.query_expansion = query_expansion
        self.settings = DecodeSettings(max_new_tokens=max_new_tokens,
                                       reasoning_limit=reasoning_limit,
                                       string_token_cap=string_token_cap,
                                       constrained=bool(constrained),
                                       force_call=bool(force_call),
                                       require_call=bool(require_call),
                                       ground_values=bool(ground_values),
                                       ground_notes=bool(ground_notes))
        self.stateless = stateless
        self.escalate_below = None if escalate_below is None else float(escalate_below)
        self.negation_gate = bool(negation_gate)
        self.tool_index_path = tool_index_path
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._prefixes = OrderedDict()
        self._tool_grammars = {}        # tool name -> grammar of its calls alone (require_tool)
        if float(prefix_checkpoint_mb) < 0:
            raise ValueError(f"prefix_checkpoint_mb must be >= 0, got {prefix_checkpoint_mb!r}")
        self._checkpoints = _PrefixCheckpoints(float(prefix_checkpoint_mb) * 2 ** 20)
        self._active = None            # the _Prefix of the conversation in progress
        self._tool_tokens = None
        self._ranker = None
        self._piece_table = None
        self._grounding_index = None
        self._said = []                 # the texts of the conversation so far (grounding sources)
        self.turns = 0
        self.compile_grammar = _compile_grammar     # replaceable (tests use a stand-in)
        vocab_out = getattr(self.model, "out_vocab", None) or getattr(self.model.config, "out_vocab", 0) \
            or getattr(self.model.config, "vocab", 0)
        self._out_vocab = int(vocab_out)

    # ------------------------------------------------------------ tool selection
    @property
    def has_embedding_head(self) -> bool:
        return "embedding" in _head_names(self.model)

    def _token_counts(self):
        if self._tool_tokens is None:
            # +1 for the separating comma / bracket of the rendered list.
            self._tool_tokens = [len(self.tokenizer.encode(s.compact_json(), dummy_prefix=False)) + 1
                                 for s in self.specs]
        return self._tool_tokens

    def _embed(self, text):
        model = self.model
        snap = model.snapshot() if model.position else None
        try:
            model.reset()
            model.prefill([BOS_ID] + list(self.tokenizer.encode(text)))
            return model.head_outputs()["embedding"]
        finally:
            if snap is not None:
                model.restore(snap)
            else:
                model.reset()

    def _ranking_method(self) -> str:
        """``bm25`` or ``embedding``: ``retrieval`` with ``auto`` resolved."""
        if self.retrieval == "auto":
            return "embedding" if self.has_embedding_head else "bm25"
        return self.retrieval

    def rank_tools(self, query: str) -> List[int]:
        """Catalogue indices in retrieval order for ``query``."""
        method = self._ranking_method()
        if method == "embedding":
            if not self.has_embedding_head:
                raise NeedleError("retrieval='embedding' needs an archive with an embedding head; "
                                  "this one has none (use retrieval='bm25')")
            if self._ranker is None:
                fp = file_fingerprint(self.model_path) if self.model_path else "model"
                self._ranker = EmbeddingRanker(self._embed, fp, self.tool_index_path)
            return self._ranker.rank(query, [s.compact_json() for s in self.specs])
        return rank_bm25(query, self.specs, expansion=self.query_expansion)

    def _clause_picks(self, query: str) -> List[int]:
        """``retrieval.clause_picks`` with this agent's ranker ([]: nothing matched)."""
        k = self.tools_per_clause
        if self._ranking_method() == "bm25":
            return clause_picks(query, self.specs, k, expansion=self.query_expansion)
        clauses = request_clauses(query)
        picks = []
        for text in [query] + (clauses if len(clauses) > 1 else []):
            picks += [i for i in self.rank_tools(text)[:k] if i not in picks]
        return picks

    def select_tools(self, query: str) -> List[ToolSpec]:
        """The tools the prompt will hold for a conversation starting with ``query``."""
        n = len(self.specs)
        counts = self._token_counts() if self.tool_token_budget is not None else [0] * n
        cap = self.max_retrieved_tools
        picks = self._clause_picks(query) if self.tools_per_clause is not None else []
        if picks:
            chosen = select_prefix(picks, counts, cap, self.tool_token_budget)
            return [self.specs[i] for i in sorted(chosen)]     # rendered in catalogue order
        fits_all = (cap is None or n <= cap) and (
            self.tool_token_budget is None or sum(counts) <= self.tool_token_budget)
        if fits_all:
            return list(self.specs)
        order = self.rank_tools(query)
        chosen = select_prefix(order, counts, cap, self.tool_token_budget)
        return [self.specs[i] for i in sorted(chosen)]     # rendered in catalogue order

    def _prefix_for(self, specs):
        names = tuple(s.name for s in specs)
        entry = self._prefixes.get(names)
        if entry is None:
            grammar = self.compile_grammar([s.grammar_schema() for s in specs], self.max_calls_per_turn)
            conv = Conversation(self.tokenizer, self.system, render_tools_json(specs))
            entry = _Prefix(names, specs, conv, grammar)
            self._prefixes[names] = entry
            while len(self._prefixes) > _PREFIX_CACHE_SIZE:
                self._prefixes.popitem(last=False)
        self._prefixes.move_to_end(names)
        return entry

    @property
    def piece_table(self) -> list:
        if self._piece_table is None:
            self._piece_table = self.tokenizer.piece_table(size=self._out_vocab)
        return self._piece_table

    # ------------------------------------------------------------------ turns
    def reset(self) -> None:
        """Rewind to the post-init prefix (the cached snapshot); keep model and tools."""
        self._active = None
        self.turns = 0

    def conversation_ids(self) -> List[int]:
        """Token ids of the conversation so far (BOS, system, tools, the turns and the
        assistant's output): the sequence the model state holds, e.g. to score it with
        the probe heads or to train them (``needle_cy.training.confidence``)."""
        return list(self._active.conversation.ids) if self._active is not None else []

    def cancel(self) -> None:
        """Cancel the turn in flight (from another thread); the agent stays usable."""
        self._cancel.set()

    def snapshot(self) -> "ConversationSnapshot":
        """The conversation so far (its turns and the model state holding them), to come
        back to with ``restore``.  Several conversations can then take turns on one agent,
        or on agents sharing one ``Model``, each resuming where it was instead of
        prefilling its turns again (``needle_cy.serve`` keeps the conversations its
        clients resend this way).  Without a conversation in progress it holds none, and
        restoring it is ``reset()``."""
        entry = self._active
        if entry is None:
            return ConversationSnapshot(self, None, (), 0, False, (), 0, None)
        conv = entry.conversation
        return ConversationSnapshot(self, entry, tuple(conv.ids), conv.n_user_turns,
                                    conv.last_turn_had_calls, tuple(self._said), self.turns,
                                    self.model.snapshot())

    def restore(self, snapshot: "ConversationSnapshot") -> None:
        """Go back to a conversation taken with ``snapshot()`` from this agent; the next
        turn continues it.  A snapshot stays valid after being restored (restore it again
        to branch the conversation again from the same point)."""
        if not isinstance(snapshot, ConversationSnapshot) or snapshot.agent is not self:
            raise ValueError("restore() takes a snapshot() of this same agent")
        if not self._lock.acquire(blocking=False):
            raise NeedleError("this Needle agent is running a turn; restore() between turns")
        try:
            entry = snapshot.entry
            if entry is None:
                self._active, self.turns, self._said = None, 0, []
                return
            self.model.restore(snapshot.model_state)
            # KV sinks are the model's setting, not part of its state: pin this prefix's
            # (a no-op once the window has wrapped, as after any long conversation)
            self._pin_prefix(len(entry.conversation.prefix_ids))
            conv = entry.conversation
            conv.ids = list(snapshot.ids)
            conv.n_user_turns = snapshot.n_user_turns
            conv.last_turn_had_calls = snapshot.last_turn_had_calls
            self._said = list(snapshot.said)
            self.turns = snapshot.turns
            self._active = entry
        finally:
            self._lock.release()

    def stream(self, text: TurnInput, max_new_tokens: Optional[int] = None,
               require_call: Optional[bool] = None,
               require_tool: Optional[str] = None) -> Iterator[Dict[str, Any]]:
        """Yield the events of one turn; the last is exactly one ``done`` or ``error``.

        ``text`` is a query, or (right after a turn with calls) the tool results as a list
        or a JSON list string.  ``max_new_tokens`` and ``require_call`` override the
        agent's settings for this turn.  ``require_tool`` (a tool name) makes the turn
        call that tool: its calls are the only ones the grammar allows, and at least one
        is made.  A conversation starting with such a turn has the tool among its
        selected tools; a later turn may require a tool the selection left out (the
        model then writes it from the grammar alone, not having read its description).
        """
        _check_turn_input(text)
        if max_new_tokens is not None:
            max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
        if require_call is not None and not isinstance(require_call, bool):
            raise TypeError(f"require_call must be True, False or None, got {require_call!r}")
        if require_tool is not None:
            if require_tool not in self.tools:
                raise ValueError(f"require_tool={require_tool!r} is not one of this agent's tools "
                                 f"({', '.join(self.tools) or 'none'})")
            if not self.settings.constrained:
                raise ValueError("require_tool needs constrained decoding (constrained=True)")
        if not self._lock.acquire(blocking=False):
            raise NeedleError("this Needle agent is already running a turn; one turn at a time")
        # A cancel() made while no turn runs is kept for this one (it was meant for the
        # turn about to start); the flag is cleared when a turn ends.
        model = self.model
        snapshot = None
        prev_active, prev_turns = self._active, self.turns
        conv_len = None
        finished = False
        try:
            yield {"type": "start"}
            t_start = time.perf_counter()
            if self.stateless:
                self._active = None
            is_results = self._is_tool_results(text)
            if isinstance(text, (list, tuple)):
                if not is_results:
                    raise NeedleError("tool results were given but no turn with calls precedes them")
                text = _results_json(list(text))    # serialized one way, as run() feeds them
            elif not is_results and not text.strip():
                raise ValueError("the request is blank: give the text of a request")
            said = (self._said if self._active is not None else []) + [text]
            if self._active is None:
                specs = self.select_tools(str(text))
                if require_tool is not None and all(s.name != require_tool for s in specs):
                    names = {s.name for s in specs} | {require_tool}
                    specs = [s for s in self.specs if s.name in names]     # catalogue order
                entry = self._prefix_for(specs)
                entry.conversation.reset()
                prefix_s = yield from self._restore_prefix(entry)
                self._active = entry
            else:
                entry = self._active
                prefix_s = 0.0
                if self.tools_per_clause is not None and not is_results:
                    wider = self._widened(entry, str(text))
                    if wider is not None:
                        snapshot = model.snapshot()      # the conversation as it was, for a rollback
                        prefix_s = yield from self._move_conversation(entry, wider)
                        entry = self._active = wider
            conv = entry.conversation
            conv_len = len(conv.ids)
            if snapshot is None:
                snapshot = model.snapshot()
            if is_results:
                new_ids = conv.tool_result_ids(text)
            else:
                new_ids = conv.query_ids(text)
            settings = self.settings
            if max_new_tokens is not None:
                settings = dataclasses.replace(settings, max_new_tokens=max_new_tokens)
            if require_call is not None:
                settings = dataclasses.replace(settings, require_call=require_call)
            grammar, specs = entry.grammar, entry.specs
            if require_tool is not None:
                settings = dataclasses.replace(settings, require_call=True)
                grammar = self._tool_grammar(require_tool)
                specs = [self.tools[require_tool]]
            value_grounder, note_grounder = self._grounders(specs, said)
            prior = None
            if not is_results and require_tool is None:
                prior = self._name_prior(str(text), specs)
            res = yield from run_turn(model, self.tokenizer, grammar, new_ids, settings,
                                      self.piece_table, cancel=self._cancel,
                                      grounder=value_grounder, note_grounder=note_grounder,
                                      name_prior=prior)
            envelope = self._envelope(res, entry, prefix_s, time.perf_counter() - t_start,
                                      None if is_results else text)
            if is_results and envelope["type"] == "refusal":
                envelope["type"] = "respond"     # the tool loop is finished (spec §8.2)
            if res.success:
                conv.append_user(new_ids)
                conv.append_assistant(res.assistant_ids, had_calls=bool(res.calls))
                self._said = said
                self.turns += 1
                finished = True
                yield {"type": "done", "response": envelope}
            else:
                self._rollback(snapshot, entry, conv_len, prev_active, prev_turns)
                finished = True
                yield {"type": "error", "error": envelope["error"],
                       "error_code": envelope["error_code"], "response": envelope}
        except Cancelled as exc:
            self._rollback(snapshot, self._active, conv_len, prev_active, prev_turns)
            finished = True
            yield {"type": "error", "error": str(exc), "error_code": "cancelled",
                   "response": _error_envelope(str(exc), "cancelled")}
        except GeneratorExit:
            if not finished:   # the consumer closed the stream mid-turn: undo the turn
                self._rollback(snapshot, self._active, conv_len, prev_active, prev_turns)
            raise
        except Exception as exc:
            if finished:
                raise
            self._rollback(snapshot, self._active, conv_len, prev_active, prev_turns)
            finished = True
            code = type(exc).__name__
            yield {"type": "error", "error": str(exc), "error_code": code,
                   "response": _error_envelope(str(exc), code), "exception": exc}
        finally:
            self._cancel.clear()
            self._lock.release()

    def _name_prior(self, query, specs):
        """The ``NamePrior`` of a request over the tools ``specs`` the grammar allows, or
        None (the option is off, or no tool shares a word with the request).  BM25 ranks
        over the whole catalogue, as ``rank_tools`` does, whatever ``retrieval`` says: its
        scores are what the prior is calibrated on."""
        if self.name_prior is None or not self.settings.constrained:
            return None
        if self._bm25 is None:
            self._bm25 = bm25_index(self.specs)
        prior = name_prior(query, self.specs, index=self._bm25, expansion=self.query_expansion)
        if prior is None:
            return None
        if self._grounding_index is None:
            self._grounding_index = GroundingIndex(self.piece_table)
        shown = {s.name for s in specs}
        rows = [(None if pick is None else self.specs[pick].name,
                 {s.name: p for s, p in zip(self.specs, probs) if s.name in shown})
                for pick, probs in prior if pick is None or self.specs[pick].name in shown]
        return NamePrior(rows, self.name_prior, index=self._grounding_index)

    def _tool_grammar(self, name):
        """The grammar of calls to the one tool ``name`` (``require_tool``), compiled once."""
        grammar = self._tool_grammars.get(name)
        if grammar is None:
            grammar = self.compile_grammar([self.tools[name].grammar_schema()], self.max_calls_per_turn)
            self._tool_grammars[name] = grammar
        return grammar

    def _grounders(self, specs, said):
        """(value grounder for the call block, note grounder for the <think> notes) of the
        tools ``specs``, each None when its setting is off; both judge against ``said``."""
        use_values = self.settings.ground_values and self.settings.constrained
        if not (use_values or self.settings.ground_notes):
            return None, None
        if self._grounding_index is None:
            self._grounding_index = GroundingIndex(self.piece_table)
        tools = {s.name: s.grammar_schema()["parameters"] for s in specs}
        return (ValueGrounder(tools, said, self._grounding_index) if use_values else None,
                NoteGrounder(tools, said, self._grounding_index) if self.settings.ground_notes else None)

    def _restore_prefix(self, entry):
        """Restore (or build once) the snapshot of the prefix; a generator for cancellation."""
        model = self.model
        t0 = time.perf_counter()
        if entry.snapshot is not None:
            model.restore(entry.snapshot)
            return 0.0
        ids = list(entry.conversation.prefix_ids)
        max_seq = int(getattr(model.config, "max_seq_len", 1 << 30))
        if len(ids) + 8 > max_seq:
            raise ContextOverflowError(
                f"the system text and tools take {len(ids)} tokens but the model's context is "
                f"{max_seq}; pass fewer tools, a tool_token_budget, or a shorter system text")
        # A prefix longer than the KV window wraps it under its own sink count, so its
        # states depend on more than its tokens: no checkpoints there.
        window = getattr(model, "kv_window", None)
        checkpoints = window is None or len(ids) < int(window)
        start, snap = self._checkpoints.longest(ids) if checkpoints else (0, None)
        if snap is not None:
            model.restore(snap)
        else:
            model.reset()
        self._pin_prefix(len(ids))
        for i in range(start, len(ids), _PREFILL_CHUNK):
            if self._cancel.is_set():
                model.reset()
                raise Cancelled("prefill")
            end = min(i + _PREFILL_CHUNK, len(ids))
            model.prefill(ids[i:end])
            if checkpoints and end % _PREFILL_CHUNK == 0 and end < len(ids):
                self._checkpoints.add(ids[:end], model.snapshot())
        entry.snapshot = model.snapshot()
        entry.reused = start
        return time.perf_counter() - t0
        yield  # pragma: no cover  (makes this a generator)

    def _pin_prefix(self, n):
        """Pin BOS + system + tools as KV sinks (spec §9.2) so long conversations keep them."""
        setter = getattr(self.model, "set_sink_tokens", None)
        window = getattr(self.model, "kv_window", None)
        if setter is None or window is None:
            return
        try:
            setter(min(n, int(window) - 1))
        except NeedleError:
            pass   # the model refuses (window already wrapped): keep its current policy

    def _widened(self, entry, text):
        """The prefix a later turn needs when its best tools are not all in ``entry``'s:
        ``entry``'s tools plus those (catalogue order, the turn's own kept first within
        ``max_retrieved_tools``), else None."""
        wanted = [s.name for s in self.select_tools(text)]
        if all(name in entry.names for name in wanted):
            return None
        keep = wanted + [name for name in entry.names if name not in wanted]
        if self.max_retrieved_tools is not None:
            keep = keep[:max(self.max_retrieved_tools, len(wanted))]
        keep = set(keep)
        return self._prefix_for([s for s in self.specs if s.name in keep])

    def _move_conversation(self, old, new):
        """Continue ``old``'s conversation on ``new``'s prefix: the prefix restored, the
        turns so far prefilled after it.  A generator (cancellation); returns the seconds."""
        t0 = time.perf_counter()
        history = list(old.conversation.ids[len(old.conversation.prefix_ids):])
        new.conversation.reset()
        yield from self._restore_prefix(new)
        for i in range(0, len(history), _PREFILL_CHUNK):
            if self._cancel.is_set():
                raise Cancelled("prefill")
            self.model.prefill(history[i:i + _PREFILL_CHUNK])
        conv = new.conversation
        conv.ids.extend(history)
        conv.n_user_turns = old.conversation.n_user_turns
        conv.last_turn_had_calls = old.conversation.last_turn_had_calls
        return time.perf_counter() - t0

    def _rollback(self, snapshot, entry, conv_len, prev_active, prev_turns):
        self._active, self.turns = prev_active, prev_turns
        if snapshot is not None:
            self.model.restore(snapshot)
        if entry is not None and conv_len is not None:
            del entry.conversation.ids[conv_len:]

    def _is_tool_results(self, text):
        if self._active is None or not self._active.conversation.last_turn_had_calls:
            return False
        if isinstance(text, (list, tuple)):
            return True
        if text.lstrip().startswith("["):
            try:
                return isinstance(json.loads(text), list)
            except ValueError:
                return False
        return False

    def _envelope(self, res, entry, prefix_s, total_s, request=None):
        calls = res.calls if res.success else []
        # Escalation (spec §5.4): each call has the confidence of the calls up to it
        # (generate._finish_confidence), and the calls from the first one below the
        # threshold on are held back in suppressed_calls, so a doubtful extra call does not
        # take the confident ones before it down with it.  Only with a confidence head: the
        # call-token probability alone is not calibrated, so a headless model is never
        # escalated.  The negation gate (§8.2) holds back every call of a turn with a
        # call the request negates.
        negated = negated_calls(request, calls) if self.negation_gate else []
        held = len(calls)
        if calls and self.escalate_below is not None and res.head_confidence is not None:
            held = next((k for k, c in enumerate(res.call_confidences)
                         if c is not None and c < self.escalate_below), held)
        if negated:
            held = 0
        prefill_s = res.prefill_s + prefix_s
        n_prefix = len(entry.conversation.prefix_ids) - entry.reused if prefix_s > 0 else 0
        n_prefill = res.n_prefill + n_prefix
        decode_s = res.reasoning_s + res.constrained_s
        if not res.success:
            kind = "error"
        else:
            kind = "call" if calls else "refusal"
        return {
            "type": kind,
            "success": res.success,
            "error": res.error,
            "error_code": res.error_code,
            "function_calls": calls[:held],
            "escalate": held < len(calls),
            "suppressed_calls": calls[held:],
            "validation": {"negation": bool(negated)},
            "reasoning": res.reasoning,
            "confidence": res.confidence,
            "call_confidences": list(res.call_confidences) if calls else [],
            "prefill_tps": (n_prefill / prefill_s) if prefill_s > 0 else 0.0,
            "decode_tps": (res.n_generated / decode_s) if decode_s > 0 else 0.0,
            "peak_ram_mb": _peak_ram_mb(),
            "stop_reason": res.stop_reason,
            "tools": list(entry.names),
            "timings": {"total_s": total_s, "prefix_s": prefix_s, "prefill_s": res.prefill_s,
                        "reasoning_s": res.reasoning_s, "constrained_s": res.constrained_s,
                        "grammar_s": res.grammar_s, "n_backtracks": res.n_backtracks,
                        "n_prefill": res.n_prefill,
                        "n_reasoning": res.n_reasoning, "n_constrained": res.n_constrained,
                        "n_prefix": n_prefix, "n_prefix_reused": entry.reused if prefix_s > 0 else 0},
        }

    def complete(self, text: TurnInput, max_new_tokens: Optional[int] = None,
                 require_call: Optional[bool] = None, require_tool: Optional[str] = None) -> Response:
        """One turn; returns the envelope.  User errors (context overflow, bad tools) raise.
        ``require_call=True`` makes this turn call a tool (see the class's ``require_call``),
        ``require_tool="name"`` that tool (see ``stream``)."""
        final = None
        for event in self.stream(text, max_new_tokens=max_new_tokens, require_call=require_call,
                                 require_tool=require_tool):
            if event["type"] in ("done", "error"):
                final = event
        exc = final.get("exception")
        if exc is not None:   # user errors (and bugs) raise; generation failures are envelopes
            raise exc
        return final["response"]

    def add_turn(self, text: TurnInput, calls: Sequence[Dict[str, Any]] = ()) -> None:
        """Put a finished turn into the conversation without decoding it: ``text`` (a
        request, or the tool results of the last turn's calls, as ``complete`` takes them)
        and the assistant's answer ``calls`` (``[{"name", "arguments"}]``; ``[]`` for
        none), held as the template holds an answer without reasoning.  A stored
        conversation resumes this way, and ``needle_cy.eval`` scores a turn after a given
        history.  The first turn selects the tools, as a decoded one does; the calls must
        be a call list of the agent's tools (else ``ValueError``); a called tool the
        prompt does not hold joins it (a later turn's moves the conversation onto a
        prompt that holds it)."""
        _check_turn_input(text)
        if not isinstance(calls, (list, tuple)) or not all(
                isinstance(c, dict) and set(c) <= {"name", "arguments"} and "name" in c for c in calls):
            raise ValueError(f"calls must be a list of {{'name', 'arguments'}} dicts, got {calls!r}")
        calls = [{"name": c["name"], "arguments": c.get("arguments") or {}} for c in calls]
        if self.stateless:
            raise NeedleError("add_turn builds up a conversation, but this agent is stateless "
                              "(every turn starts afresh); create it with stateless=False")
        if not self._lock.acquire(blocking=False):
            raise NeedleError("this Needle agent is already running a turn; one turn at a time")
        try:
            is_results = self._is_tool_results(text)
            if isinstance(text, (list, tuple)):
                if not is_results:
                    raise NeedleError("tool results were given but no turn with calls precedes them")
                text = _results_json(list(text))
            elif not is_results and not text.strip():
                raise ValueError("the request is blank: give the text of a request")
            called = {c["name"] for c in calls if c["name"] in self.tools}
            if self._active is None:
                names = {s.name for s in self.select_tools(str(text))} | called
                entry = self._prefix_for([s for s in self.specs if s.name in names])
            else:
                entry = self._active
                if not called <= set(entry.names):      # a stored turn calls a tool the prompt lacks
                    names = set(entry.names) | called
                    wider = self._prefix_for([s for s in self.specs if s.name in names])
                    next(self._move_conversation(entry, wider), None)   # never yields
                    entry = self._active = wider
            body = compact_json(calls).encode("utf-8")
            state = entry.grammar.start()
            if not (state.feed(body) and state.is_complete()):
                raise ValueError(f"the calls {body.decode()} are not a call list of this "
                                 f"conversation's tools ({', '.join(entry.names)}): a tool name "
                                 f"outside them, arguments against a schema, or more than "
                                 f"{self.max_calls_per_turn} calls")
            if self._active is None:
                entry.conversation.reset()
                restore = self._restore_prefix(entry)
                next(restore, None)           # a generator that returns without yielding
            conv = entry.conversation
            new_ids = conv.tool_result_ids(text) if is_results else conv.query_ids(text)
            # the markers are the template's, the calls' JSON is outside text
            answer_ids = encode_template(self.tokenizer, [TOOL_CALL, OutsideText(body.decode("utf-8")),
                                                          TOOL_CALL_END + IM_END])
            max_seq = int(getattr(self.model.config, "max_seq_len", 1 << 30))
            if self.model.position + len(new_ids) + len(answer_ids) + CLOSING_RESERVE > max_seq:
                raise ContextOverflowError(
                    f"the turn needs {len(new_ids) + len(answer_ids)} tokens after the "
                    f"{self.model.position} of the conversation, more than the model's context "
                    f"of {max_seq} leaves; start a new conversation")
            self.model.prefill(new_ids + answer_ids)
            conv.append_user(new_ids)
            conv.append_assistant(answer_ids, had_calls=bool(calls))
            self._said = (self._said if self._active is not None else []) + [text]
            self._active = entry
            self.turns += 1
        finally:
            self._lock.release()

    def _execute(self, call, timeout=None):
        """(result, status) of one call: status ``ok``, ``error`` (the result is
        ``{"error": message}``, fed back to the model as the official ``run()`` does) or
        ``timeout``.  The function runs in a worker thread so that a timeout and
        ``cancel()`` can stop the wait; raises ``Cancelled`` on a cancel.  Python cannot
        stop a thread, so a timed-out or cancelled function keeps running in the
        background until it returns (its result is dropped)."""
        name = call.get("name")
        spec = self.tools.get(name)
        if spec is None:
            return {"error": f"Unknown tool: {name}"}, "error"
        if spec.function is None:
            return {"error": f"Tool {name} has no Python function to execute"}, "error"
        outcome = {}
        finished = threading.Event()

        def work():
            try:
                outcome["result"] = spec.function(**(call.get("arguments") or {}))
            except BaseException as exc:   # SystemExit, KeyboardInterrupt too: a tool's failure
                outcome["exception"] = exc
            finally:
                finished.set()

        threading.Thread(target=work, name=f"needle-tool-{name}", daemon=True).start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not finished.wait(_TOOL_POLL_S):
            if self._cancel.is_set():
                raise Cancelled(f"tool {name}")
            if deadline is not None and time.monotonic() >= deadline:
                return {"error": f"Tool {name} timed out after {timeout:g} s"}, "timeout"
        exc = outcome.get("exception")
        if exc is None:
            return outcome.get("result"), "ok"
        if isinstance(exc, Exception):
            return {"error": str(exc) or type(exc).__name__}, "error"
        return {"error": f"Tool {name} raised {type(exc).__name__}({exc})"}, "error"

    def _results_that_fit(self, results):
        """(results to feed back, number of results cut) so that the tool-result turn
        leaves the next turn ``_ANSWER_ROOM`` tokens to answer.  A result too long for
        that is replaced by the start of its JSON text and a visible marker
        (``...[cut: N of M characters]``); ``ContextOverflowError`` when even the markers
        do not fit.  The model's context is never overrun."""
        conv = self._active.conversation
        max_seq = int(getattr(self.model.config, "max_seq_len", 1 << 30))
        answer = min(self.settings.max_new_tokens, _ANSWER_ROOM)
        room = max_seq - self.model.position - CLOSING_RESERVE - answer

        def size(items):
            return len(conv.tool_result_ids(_results_json(items)))

        if size(results) <= room:
            return results, 0
        texts = [_results_json(r) for r in results]

        def cut_to(limit):
            return [r if len(t) <= limit else
                    f"{t[:limit]}...[cut: {len(t) - limit} of {len(t)} characters]"
                    for r, t in zip(results, texts)]

        if size(cut_to(0)) > room:
            raise ContextOverflowError(
                f"the tool results do not fit in what is left of the model's context "
                f"({max(room, 0)} tokens of {max_seq} after this conversation, with room to "
                f"answer); start a new conversation or make the tools return less")
        low, high = 0, max(len(t) for t in texts)     # low fits, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if size(cut_to(mid)) <= room else (low, mid)
        return cut_to(low), sum(len(t) > low for t in texts)

    def run(self, query: str, max_steps: int = 8, max_new_tokens: Optional[int] = None,
            repeat_calls: bool = False, tool_timeout: Optional[float] = 30.0) -> RunResponse:
        """Complete, execute the calls, feed results back; stop at ``[]``, an error or
        ``max_steps`` executions.  Returns the last envelope with ``results`` (all
        executed results, in order), ``executed_calls`` (each executed call beside its
        result), ``steps`` and ``loop_stop`` (why the loop ended).

        A turn that asks again for exactly the calls whose results it was just given is
        not executed (``repeated_calls: true``): a small model's loop, not a new request,
        and running it again would repeat the side effects (an item added twice).
        ``repeat_calls=True`` executes such turns too (polling tools).

        A turn calling a tool that has no Python function (a JSON-Schema tool) ends the
        loop with the turn's calls unexecuted in ``function_calls`` and the reason in
        ``unexecuted_reason``: the caller executes them.  Each call has ``tool_timeout``
        seconds (``None``: no limit); past it the model gets ``{"error": "... timed out
        ..."}``.  ``cancel()`` also stops a running tool.  When what ran no longer fits in
        the model's context, the envelope is an error (``error_code``
        ``context_overflow``) that keeps ``results`` and ``executed_calls``."""
        max_steps = _int_at_least("max_steps", max_steps, 0)
        if tool_timeout is not None and not (isinstance(tool_timeout, (int, float))
                                             and not isinstance(tool_timeout, bool)
                                             and tool_timeout > 0):
            raise ValueError(f"tool_timeout must be a number of seconds > 0, or None; "
                             f"got {tool_timeout!r}")
        executed, steps, previous, cut = [], 0, None, 0
        try:
            response = self.complete(query, max_new_tokens=max_new_tokens)
            while True:
                calls = response["function_calls"]
                if not response["success"]:
                    stop = "error"
                elif not calls:
                    stop = "no_calls"
                elif steps >= max_steps:
                    response["max_steps_reached"] = True
                    stop = "max_steps"
                elif not repeat_calls and calls == previous:
                    response["repeated_calls"] = True
                    stop = "repeated_calls"
                else:
                    schema_only = sorted({c["name"] for c in calls if c["name"] in self.tools
                                          and self.tools[c["name"]].function is None})
                    stop = "not_executable" if schema_only else None
                if stop == "not_executable":
                    response["unexecuted_reason"] = (
                        f"{', '.join(schema_only)} {'has' if len(schema_only) == 1 else 'have'} "
                        f"no Python function: the calls in function_calls were not executed "
                        f"(execute them and pass their results to complete())")
                if stop is not None:
                    break
                previous = calls
                steps += 1
                results = []
                for call in calls:
                    entry = {"name": call["name"], "arguments": call.get("arguments") or {},
                             "result": {"error": "cancelled while the tool was running"},
                             "status": "cancelled", "step": steps}
                    executed.append(entry)      # started: its side effects may happen
                    entry["result"], entry["status"] = self._execute(call, tool_timeout)
                    results.append(entry["result"])
                fed, n_cut = self._results_that_fit(results)
                cut += n_cut
                response = self.complete(fed, max_new_tokens=max_new_tokens)
        except Cancelled as exc:          # cancel() while a tool ran
            response, stop = _error_envelope(str(exc), "cancelled", self._active_tools()), "error"
        except ContextOverflowError as exc:
            if not executed:              # nothing ran: the request itself does not fit
                raise
            response = _error_envelope(str(exc), "context_overflow", self._active_tools())
            stop = "error"
        finally:
            self._cancel.clear()          # a cancel() for this run is spent
        response["results"] = [e["result"] for e in executed]
        response["executed_calls"] = executed
        response["steps"] = steps
        response["loop_stop"] = stop
        if cut:
            response["results_cut"] = cut
        return response

    def _active_tools(self):
        return self._active.names if self._active is not None else ()


def _check_grammars(specs):
    """Compile each tool's parameters now (cached for the turns), so that a keyword the
    grammar cannot enforce fails at construction, naming the tool."""
    from .grammar.tools import check_tools
    check_tools([s.grammar_schema() for s in specs])


def _compile_grammar(schemas, max_calls):
    from .grammar import compile_tools
    return compile_tools(schemas, max_calls=max_calls)


def _results_json(results):
    return json.dumps(results, default=str)


def _error_envelope(message, code, tools=()):
    """The envelope of a turn that failed before it produced anything: every field of a
    turn's envelope, with nothing decoded."""
    return {"type": "error", "success": False, "error": message, "error_code": code,
            "function_calls": [], "escalate": False, "suppressed_calls": [],
            "validation": {"negation": False}, "reasoning": "",
            "confidence": None, "call_confidences": [], "prefill_tps": 0.0,
            "decode_tps": 0.0, "peak_ram_mb": _peak_ram_mb(), "stop_reason": code,
            "tools": list(tools),
            "timings": {"total_s": 0.0, "prefix_s": 0.0, "prefill_s": 0.0, "reasoning_s": 0.0,
                        "constrained_s": 0.0, "grammar_s": 0.0, "n_backtracks": 0,
                        "n_prefill": 0, "n_reasoning": 0, "n_constrained": 0,
                        "n_prefix": 0, "n_prefix_reused": 0}}


def _check_turn_input(text):
    """A turn takes a request (str) or tool results (a list, or their JSON text)."""
    if isinstance(text, (str, list, tuple)):
        return
    hint = " (decode the bytes first)" if isinstance(text, (bytes, bytearray)) else ""
    raise TypeError(f"a turn takes the request as str, or tool results as a list; "
                    f"got {type(text).__name__}{hint}")


def _positive_int(name, value):
    """``value`` as an int >= 1, or a ValueError naming the setting."""
    return _int_at_least(name, value, 1)


def _int_at_least(name, value, minimum):
    """``value`` as an int >= ``minimum`` (an int, or a float with an integer value), or a
    ValueError naming the setting."""
    number = None
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            pass
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def _head_names(model):
    heads = getattr(model, "heads", None)
    if heads is None:
        archive = getattr(model, "archive", None)
        heads = getattr(archive, "heads", ()) if archive is not None else ()
    return tuple(heads or ())


def _load(model, backend, threads, tokenizer, model_file=None):
    """(model, tokenizer, path or None) from whatever ``model=`` was given."""
    path = None
    if model is None:
        if not DEFAULT_MODEL_PATH.exists():
            raise ModelNotAvailableError(
                f"no model given and the embedded default model is not installed "
                f"({DEFAULT_MODEL_PATH} is missing); pass model='path/to/model.cact' (CLI: --model)")
        model = DEFAULT_MODEL_PATH
    elif model_file is not None and not isinstance(model, (str, os.PathLike)):
        raise ValueError("model_file= picks the archive inside a folder or a Hugging Face model; "
                         f"model is a {type(model).__name__}")
    if isinstance(model, (str, os.PathLike)):
        path = resolve_model(model, model_file)
        from .model import Model
        loaded = Model.load(str(path), backend=backend, threads=threads)
        if tokenizer is None:
            from .tokenizer import Tokenizer
            tokenizer = Tokenizer.from_archive(str(path))
        return loaded, tokenizer, str(path)
    if hasattr(model, "prefill") and hasattr(model, "step"):
        if tokenizer is None:
            archive = getattr(model, "archive", None)
            if archive is None:
                raise NeedleError("a Model object without an archive needs tokenizer=")
            from .tokenizer import Tokenizer
            tokenizer = Tokenizer.from_archive(archive)
        archive = getattr(model, "archive", None)
        path = getattr(archive, "path", None)
        return model, tokenizer, (str(path) if path else None)
    # An Archive object.
    from .model import Model
    loaded = Model.load(model, backend=backend, threads=threads)
    if tokenizer is None:
        from .tokenizer import Tokenizer
        tokenizer = Tokenizer.from_archive(model)
    path = getattr(model, "path", None)
    return loaded, tokenizer, (str(path) if path else None)


def extract(text: str, schema: Any, model: ModelSource = None, **kwargs: Any) -> Any:
    """Structured extraction as a single-tool call: the arguments of the first call, or
    ``None`` when the model declines.  ``schema`` is a tool definition, a pydantic model,
    or a bare object schema (wrapped as a tool named after its ``title`` or ``extract``)."""
    if isinstance(schema, dict) and "name" not in schema and "function" not in schema:
        schema = {"name": str(schema.get("title") or "extract").replace(" ", "_"),
                  "description": schema.get("description", "Extract the record from the text."),
                  "parameters": schema}
    spec = normalize_tool(schema, strict=bool(kwargs.get("strict", False)))
    # A record is returned even from a negated sentence ("she doesn't eat meat" is a
    # fact to record), as the official engine does for extraction sessions.
    kwargs.setdefault("negation_gate", False)
    agent = Needle(model, tools=[spec], max_calls_per_turn=1, **kwargs)
    response = agent.complete(text)
    if not response["success"]:
        raise NeedleError(f"extraction failed: {response['error']}")
    calls = response["function_calls"]
    if not calls:
        return None
    arguments = calls[0]["arguments"]
    if spec.pydantic_model is not None:
        validate = getattr(spec.pydantic_model, "model_validate", None) or spec.pydantic_model.parse_obj
        return validate(arguments)
    return arguments
