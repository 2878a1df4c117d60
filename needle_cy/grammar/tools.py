"""The grammar of a tool-call list: each tool's parameters compiled once (cached by canonical
JSON) and linked with an automaton of the tool names into one program."""
from __future__ import annotations

import json
import re

import numpy as np

from ..errors import GrammarLimitError, SchemaError, UnsupportedSchemaError
from .automata import _dead_dfa, _reach_sets, literal_dfa, prune_dfa_keep
from .builder import compile_program
from .limits import ANY_NODE, MAX_TOOLS, NEVER_NODE
from .program import Program, link_programs

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-:]+")


_FRAGMENTS = {}


def _canonical(params):
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _fragment(params):
    """The compiled program of one tool's parameters (cached by canonical JSON)."""
    key = _canonical(params)
    hit = _FRAGMENTS.get(key)
    if hit is None:
        hit = compile_program(params)
        if len(_FRAGMENTS) > 512:
            _FRAGMENTS.clear()
        _FRAGMENTS[key] = hit
    return hit


# What to do about a tool whose parameters do not compile, by error class.
_TOOL_FIXES = {
    UnsupportedSchemaError: "remove that keyword from the tool's parameters (the tool's function "
                            "can check the constraint itself) or express it with the supported "
                            "keywords listed in needle_cy.grammar",
    GrammarLimitError: "simplify the tool's parameters (fewer nesting levels or alternatives)",
    SchemaError: "correct the tool's parameters",
}


def _tool_fragment(tool, i):
    """The compiled parameters of ``tool`` (the ``i``-th); an error names the tool, where in
    its parameters the problem is (pointers start at its parameters, ``#``) and what to do."""
    try:
        return _fragment(_params_of(tool))
    except (UnsupportedSchemaError, SchemaError, GrammarLimitError) as exc:
        name = tool.get("name") if isinstance(tool, dict) else None
        who = f"tool {name!r}" if isinstance(name, str) else f"tool #{i}"
        kind = next(c for c in _TOOL_FIXES if isinstance(exc, c))
        message = f"{who}, in its parameters: {exc}; {_TOOL_FIXES[kind]}"
        if isinstance(exc, UnsupportedSchemaError):
            raise UnsupportedSchemaError(message, keyword=exc.keyword, pointer=exc.pointer) from None
        raise type(exc)(message) from None


def check_tools(tools):
    """Compile each tool's parameters (cached, so a later ``compile_tools`` reuses them):
    the same errors ``compile_tools`` raises for a tool, each naming the tool, without
    linking a grammar (any number of tools)."""
    for i, t in enumerate(tools):
        _tool_fragment(t, i)


def compile_tools_program(tools, max_calls=4):
    if not isinstance(tools, (list, tuple)):
        raise SchemaError("tools must be a list of {name, description, parameters}")
    if len(tools) > MAX_TOOLS:
        raise GrammarLimitError(f"{len(tools)} tools; at most {MAX_TOOLS} per grammar")
    if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
        raise SchemaError(f"max_calls must be a non-negative integer, found {max_calls!r}")
    names = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or "name" not in t:
            raise SchemaError(f"tool #{i} has no name")
        n = t["name"]
        if not isinstance(n, str) or not _NAME_RE.fullmatch(n):
            raise SchemaError(f"tool #{i} name {n!r}: expected letters, digits, '_', '.', '-', ':'")
        if n in names:
            raise SchemaError(f"tool name {n!r} appears twice")
        names.append(n)
    frags = [_tool_fragment(t, i) for i, t in enumerate(tools)] or [_fragment(True)]
    # tools are numbered in name order (labels of the name automaton, bits of the used-tools
    # set), so a reordered set reuses the same name automaton; it rides along as a last,
    # node-less fragment
    order = sorted(range(len(names)), key=names.__getitem__)
    names = [names[i] for i in order]
    tail = _tool_names_program(names, [frags[i].root for i in order])
    p, nodes, dfa_bases = link_programs(frags + [tail])
    p.tools_mode = 1
    p.max_calls = max_calls
    p.tool_names = names
    p.tool_nodes = np.asarray([nodes[i] for i in order], dtype=np.int64)
    p.tool_dfa = dfa_bases[-1]
    p.root = ANY_NODE
    return p.finish()


def _params_of(tool):
    params = tool.get("parameters")
    return {"type": "object"} if params is None else params


_TOOL_NAME_PROGRAMS = {}


def _tool_names_program(names, roots):
    """A node-less program holding the automaton of the tool names (label = tool index;
    reach sets over tools).  Tools whose parameters can never be valid cannot be named."""
    key = (tuple(names), tuple(r == NEVER_NODE for r in roots[:len(names)]))
    hit = _TOOL_NAME_PROGRAMS.get(key)
    if hit is not None:
        return hit
    q = Program()
    if names:
        trie = literal_dfa([n.encode() for n in names], labels=list(range(len(names))))
        if any(key[1]):
            acc = [a if (a >= 0 and not key[1][a]) else -1 for a in trie.accept.tolist()]
            trie = prune_dfa_keep(trie.relabel(acc, trim=False))
        reach, other = _reach_sets(trie, list(range(len(names))), 1)
        q.add_dfa(trie, reach, other)
    else:
        q.add_dfa(_dead_dfa(), [[0]], [0])
    q.label_is_class = [0] * len(q.accept)   # labels are tool indices, not key classes
    q.finish()
    if len(_TOOL_NAME_PROGRAMS) >= 256:
        _TOOL_NAME_PROGRAMS.clear()
    _TOOL_NAME_PROGRAMS[key] = q
    return q

