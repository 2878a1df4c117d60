"""The trained chat template, rendered turn by turn (spec §7).

A conversation on the wire is::

    [BOS] ▁ [<|im_start|>system\\n{system}<|im_end|>\\n]            (only if system is set)
    <|im_start|>user\\n<tools>{compact tools JSON}</tools>          ← the cached prefix
    \\n{query}<|im_end|>\\n<|im_start|>assistant\\n                    ← first turn
    <think>\\n{reasoning}\\n</think>\\n<tool_call>[…]</tool_call><|im_end|>   (generated ids)
    \\n<|im_start|>user\\n<tool_result>[…]</tool_result><|im_end|>\\n<|im_start|>assistant\\n
    \\n<|im_start|>user\\n{next query}<|im_end|>\\n<|im_start|>assistant\\n

Markers come only from the template.  The system facts, the tools JSON, the queries
and the tool results are outside text: a marker's spelling in them is encoded as text
(``Tokenizer.encode``'s default), never as the marker's id, so no request, tool result or
tool description can close the tools block or write a turn.  ``encode_template`` does
this: the template's own markers become marker ids, and the text between two of them
(template text and outside text together) is encoded in one piece with markers off.

Why per-turn encoding is exact: the reference encoder flushes its BPE buffer at every
marker, and every boundary above sits right after a marker, so encoding the prefix with
the dummy "▁" and every appended string with ``dummy_prefix=False`` yields exactly
``[BOS] + encode(whole text, allowed_special="all")`` (spec §7.2) whenever the outside
text holds no marker spelling.  Generated ids are appended as ids, never re-encoded.
"""
from __future__ import annotations

import datetime
import json
import re

__all__ = [
    "BOS_ID", "MARKERS", "with_date_fact", "compact_json", "render_tools_json", "prefix_text", "first_query_text",
    "next_query_text", "tool_result_text", "assistant_text", "OutsideText", "encode_template", "Conversation",
]

BOS_ID = 2
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK, THINK_END = "<think>", "</think>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESULT, TOOL_RESULT_END = "<tool_result>", "</tool_result>"
MARKERS = (IM_START, IM_END, THINK, THINK_END, "<tools>", "</tools>", TOOL_CALL,
           TOOL_CALL_END, TOOL_RESULT, TOOL_RESULT_END)
# The template's markers, longest first so that no marker is cut by a shorter one.
_TEMPLATE_MARKER = re.compile("(" + "|".join(re.escape(m) for m in sorted(MARKERS, key=len, reverse=True)) + ")")


class OutsideText(str):
    """A piece of a template that came from outside it (a query, a tool result, the tools
    JSON, system facts): ``encode_template`` encodes its marker spellings as text."""

    __slots__ = ()


def encode_template(tokenizer, parts, dummy_prefix: bool = False) -> list:
    """Ids of a template rendered from ``parts``: plain ``str`` parts are the template
    (its chat markers become marker ids), ``OutsideText`` parts are text (a marker
    spelling in them becomes ordinary pieces).  The text between two template markers is
    encoded whole, so on outside text without marker spellings the ids equal those of
    ``tokenizer.encode("".join(parts), dummy_prefix, allowed_special="all")``."""
    ids, run = [], []
    first = True

    def flush(before_marker):
        nonlocal first
        text = "".join(run)
        run.clear()
        if first and dummy_prefix and before_marker and not text and tokenizer.add_dummy_prefix:
            # The dummy "▁" in front of a leading marker is a segment of its own.
            ids.extend(tokenizer.encode(" ", dummy_prefix=False))
        elif text:
            ids.extend(tokenizer.encode(text, dummy_prefix=first and dummy_prefix))
        first = False

    for part in parts:
        if isinstance(part, OutsideText):
            run.append(str(part))
            continue
        for k, piece in enumerate(_TEMPLATE_MARKER.split(part)):
            if k % 2:           # a marker the template wrote
                flush(True)
                ids.append(tokenizer.marker_id(piece))
            elif piece:
                run.append(piece)
    flush(False)
    return ids


_DATE_KEY = re.compile(r"(?<![A-Za-z])date:")
_DATE_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def with_date_fact(system, now=None) -> str:
    """Spec §8.4 date handling: keep ``system`` when it already has a ``date:`` key or a
    YYYY-MM-DD stamp; else add ``date: YYYY-MM-DD Ddd HH:MM`` (local time) — alone when
    blank, not at all when the text is JSON facts (starts with ``{``), else in front."""
    text = system or ""
    if _DATE_KEY.search(text) or _DATE_STAMP.search(text):
        return text
    now = now or datetime.datetime.now()
    fact = f"date: {now:%Y-%m-%d} {_WEEKDAYS[now.weekday()]} {now:%H:%M}"
    if not text.strip():
        return fact
    if text.lstrip().startswith("{"):
        return text
    return f"{fact}; {text}"


def compact_json(obj) -> str:
    """The training serialisation: `,`/`:` separators, UTF-8 kept, key order kept."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def render_tools_json(tools) -> str:
    """Compact JSON list of tool schemas (ToolSpec, dicts, or a JSON string re-emitted)."""
    if isinstance(tools, str):
        return compact_json(json.loads(tools))
    return "[" + ",".join(t.compact_json() if hasattr(t, "compact_json") else compact_json(t)
                          for t in tools) + "]"


def prefix_parts(system, tools_json: str) -> tuple:
    """``prefix_text`` as template parts (``encode_template``)."""
    system = (system or "").strip()
    head = (f"{IM_START}system\n", OutsideText(system), f"{IM_END}\n") if system else ()
    return head + (f"{IM_START}user\n<tools>", OutsideText(tools_json), "</tools>")


def first_query_parts(query: str) -> tuple:
    return ("\n", OutsideText(query), f"{IM_END}\n{IM_START}assistant\n")


def next_query_parts(query: str) -> tuple:
    return (f"\n{IM_START}user\n", OutsideText(query), f"{IM_END}\n{IM_START}assistant\n")


def tool_result_parts(results) -> tuple:
    body = results if isinstance(results, str) else json.dumps(results)
    return (f"\n{IM_START}user\n{TOOL_RESULT}", OutsideText(body),
            f"{TOOL_RESULT_END}{IM_END}\n{IM_START}assistant\n")


def prefix_text(system, tools_json: str) -> str:
    """System block (only when non-empty after stripping) + the user turn up to </tools>."""
    return "".join(prefix_parts(system, tools_json))


def first_query_text(query: str) -> str:
    """Rest of the first user turn (after the cached prefix) + the assistant header."""
    return "".join(first_query_parts(query))


def next_query_text(query: str) -> str:
    """A follow-up user query after a closed assistant turn."""
    return "".join(next_query_parts(query))


def tool_result_text(results) -> str:
    """A tool-result turn.  ``results`` is a list (dumped like the official ``run``:
    ``json.dumps`` defaults) or an already-serialised string inserted verbatim."""
    return "".join(tool_result_parts(results))


def assistant_text(reasoning, calls) -> str:
    """The assistant target as trained (used for rendering/tests; decoding appends ids)."""
    reasoning = (reasoning or "").strip()
    think = f"{THINK}\n{reasoning}\n{THINK_END}\n" if reasoning else ""
    body = calls if isinstance(calls, str) else compact_json(calls)
    return f"{think}{TOOL_CALL}{body}{TOOL_CALL_END}{IM_END}"


class Conversation:
    """Token ids of one conversation, built turn by turn.

    ``prefix_ids`` (BOS + system + tools) is what the model prefills once and caches;
    each ``add_*`` returns only the new ids, which is what a turn prefills.
    """

    def __init__(self, tokenizer, system, tools_json: str, bos_id: int = BOS_ID):
        self.tokenizer = tokenizer
        self.system = (system or "").strip()
        self.tools_json = tools_json
        self.prefix_text = prefix_text(self.system, tools_json)
        self.prefix_ids = [bos_id] + encode_template(tokenizer, prefix_parts(self.system, tools_json),
                                                     dummy_prefix=True)
        self.ids = list(self.prefix_ids)
        self.n_user_turns = 0
        self.last_turn_had_calls = False

    def reset(self):
        self.ids = list(self.prefix_ids)
        self.n_user_turns = 0
        self.last_turn_had_calls = False

    def query_ids(self, query: str) -> list:
        """Ids of a user query turn (first or follow-up), not yet appended."""
        parts = first_query_parts(query) if self.n_user_turns == 0 else next_query_parts(query)
        return encode_template(self.tokenizer, parts)

    def tool_result_ids(self, results) -> list:
        return encode_template(self.tokenizer, tool_result_parts(results))

    def append_user(self, ids):
        self.ids.extend(ids)
        self.n_user_turns += 1

    def append_assistant(self, ids, had_calls: bool):
        self.ids.extend(ids)
        self.last_turn_had_calls = had_calls

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)
