"""Grammar compilation: byte-class compressed automata, linking, and the compile caches.

The runtime reads class-compressed transition tables; the pure-Python reference reads
the same program expanded to 256 columns per state, so Cython ≡ reference on byte
streams checks the compression end to end.  The caches (tool sets, per-tool fragments,
literal/pattern automata, tool-name automata) must never change what a grammar accepts:
programs compiled warm are compared table by table with programs compiled cold, and
languages of equivalent sets are compared on random byte streams.
"""
import copy
import json
import random

import numpy as np
import pytest

from conftest import shared_path
from grammar_helpers import random_walk
from needle_cy import grammar as G
from needle_cy.errors import UnsupportedSchemaError
from needle_cy.grammar import automata, program, regex
from needle_cy.grammar import compile_schema, compile_tools

ALPHABET = b'{}[],:"\\-+.0123456789eEtrufalsnbxyz_ \xc3\xa9'


def _catalogue():
    return json.loads(shared_path("eval", "home_tools.json").read_text())


def _dev_calls(n=40):
    lines = shared_path("eval", "home_dev.jsonl").read_text().splitlines()
    return [json.dumps(json.loads(x)["answers"], separators=(",", ":")).encode() for x in lines[:n] if x.strip()]


def _walk(rng, g, max_len=160, noise=0.1):
    """A mostly-valid random byte stream for g over all 256 byte values."""
    return random_walk(rng, g, max_len=max_len, noise=noise)


def _same_language(g1, g2, streams):
    """Byte by byte: both accept the same prefixes and agree on completeness."""
    for data in streams:
        s1, s2 = g1.start(), g2.start()
        for i in range(len(data)):
            a, b = s1.feed(data[i:i + 1]), s2.feed(data[i:i + 1])
            assert a == b, data[: i + 1]
            if not a:
                break
            assert s1.is_complete() == s2.is_complete(), data[: i + 1]


# ----------------------------------------------------------------------------- byte classes

def _dfas():
    out = [regex.regex_dfa(p) for p in (r"^[a-z]+\d{2,3}$", r"ab|cd", r"^\w+@x\.(com|org)$", r"^é+[^a]?$")]
    out += [regex.regex_dfa(G.FORMAT_REGEX[f]) for f in ("email", "date-time", "uri")]
    out += [automata.literal_dfa([b"kitchen", b"kids room", b"k"]),
            automata.literal_dfa([b"a", b"ab"], labels=[3, 4], other_label=7),
            automata.literal_dfa([bytes(range(256))]),            # every byte used: 256 classes
            automata.literal_dfa([])]
    out.append(automata.complement_dfa(out[0]))
    out.append(automata.intersect_dfas([out[0], out[2]]))
    return out


def test_compressed_tables_expand_to_the_transitions():
    for d in _dfas():
        cmap, table = automata._compress(d)
        assert cmap.dtype == np.uint8 and cmap.shape == (256,)
        assert table.shape == (d.n, int(cmap.max()) + 1)
        assert np.array_equal(table[:, cmap], d.trans)
        # a DFA built from its class form has the same transitions
        assert np.array_equal(automata.DFA(None, d.accept, cls=(cmap, table)).trans, d.trans)


def test_compression_survives_hash_collisions(monkeypatch):
    """All column hashes equal: the exact check must catch it and fall back to exact classes."""
    for d in _dfas():
        want = d.trans.copy()
        fresh = automata.DFA(want, d.accept)
        monkeypatch.setattr(automata, "_COL_WEIGHTS", np.zeros(max(d.n, 1), np.int64))
        cmap, table = automata._compress(fresh)
        monkeypatch.undo()
        assert np.array_equal(table[:, cmap], want)


def test_program_tables_are_compressed(monkeypatch):
    tools = _catalogue()
    p = G.compile_tools_program(tools)
    n_states = len(p.accept)
    byte_class, class_trans, k = p.runtime_tables()
    assert k < 64 and class_trans.shape == (n_states * k,)       # the point of byte classes
    # every automaton's own classes refine into the program's: expanding either form gives
    # the same 256-wide transitions
    per_automaton = np.asarray(p.dfa_trans)[np.asarray(p.dfa_row)[:, None] + np.asarray(p.dfa_classes)[
        np.asarray(p.dfa_cmap)[:, None] + np.arange(256)]]
    assert np.array_equal(p.trans.reshape(n_states, 256), per_automaton)
    assert ((per_automaton >= -1) & (per_automaton < n_states)).all()
    # the C runtime builds the same table in C
    from needle_cy.grammar import _runtime
    assert np.array_equal(_runtime._class_trans(p, p.byte_classes()[1]), class_trans)
    bad = G.compile_tools_program(tools[:2])
    bad.dfa_row = np.asarray(bad.dfa_row) + len(bad.dfa_trans)
    with pytest.raises(ValueError):
        _runtime._class_trans(bad, bad.byte_classes()[1])
    bad = G.compile_tools_program(tools[:2])
    bad.dfa_trans = np.asarray(bad.dfa_trans).copy()
    bad.dfa_trans[0] = len(bad.accept) + 5
    with pytest.raises(ValueError):
        _runtime._class_trans(bad, bad.byte_classes()[1])
    # with every column hash equal, the exact check falls back to exact classes
    monkeypatch.setattr(automata, "_COL_WEIGHTS", np.zeros(4096, np.int64))
    b2, first2 = program._program_classes(np.asarray(p.dfa_classes))
    t2 = program._state_major(np.asarray(p.dfa_classes), np.asarray(p.dfa_row, dtype=np.int64),
                        np.asarray(p.dfa_cmap, dtype=np.int64), np.asarray(p.dfa_trans), first2)
    assert np.array_equal(t2.reshape(n_states, len(first2))[:, b2], per_automaton)


# ----------------------------------------------------------------------------- caches

def _program_tables(p):
    """Every table of a program that defines its language (the compressed transitions
    through their expansion: class numbering may differ between equivalent compiles)."""
    out = {name: np.asarray(getattr(p, name)).tolist() for name in program.NODE_FIELDS}
    for name in ("prefix_pool", "alt_pool", "cls_prop", "cls_node", "accept", "reach_off", "other",
                 "dep_pool", "tool_nodes"):
        out[name] = np.asarray(getattr(p, name)).tolist()
    out["words"] = [int(w) for w in p.words]
    out["trans"] = p.trans.tolist()
    out["num_checks"] = p.num_checks
    out["scalars"] = (p.tools_mode, p.max_calls, p.tool_dfa, p.root, list(p.tool_names))
    return out


def test_warm_compile_equals_cold_compile():
    tools = _catalogue()
    G.clear_caches()
    cold = _program_tables(G.compile_tools_program(tools))
    # warm: fragments, literal/pattern automata and the name automaton all come from caches,
    # after other sets have populated them in a different order
    rng = random.Random(5)
    for _ in range(3):
        G.compile_tools_program(rng.sample(tools, 7))
    assert _program_tables(G.compile_tools_program(tools)) == cold
    # a schema compiled alone, cold and warm
    sch = tools[3]["parameters"]
    G.clear_caches()
    one = _program_tables(G.compile_program(sch))
    G.compile_tools_program(tools)
    assert _program_tables(G.compile_program(sch)) == one


def test_reordered_and_redescribed_sets_accept_the_same_calls():
    tools = _catalogue()
    g = compile_tools(tools)
    shuffled = copy.deepcopy(tools)
    random.Random(3).shuffle(shuffled)
    for t in shuffled:
        t["description"] = "changed: " + t["description"]
    g2 = compile_tools(shuffled)
    for text in _dev_calls():
        assert g.accepts(text) and g2.accepts(text)
    rng = random.Random(11)
    streams = [_walk(rng, g) for _ in range(25)]
    _same_language(g, g2, streams)
    # and the reordered set equals a cold compile of itself, on the pure-Python reference
    G.clear_caches()
    gp = compile_tools(shuffled, backend="python")
    _same_language(g2, gp, streams[:10])


def test_shared_enum_under_different_property_names():
    rooms = ["kitchen", "bedroom", "kids room"]
    tools = [
        {"name": "a", "parameters": {"type": "object", "properties": {"room": {"enum": rooms}},
                                     "required": ["room"], "additionalProperties": False}},
        {"name": "b", "parameters": {"type": "object", "properties": {"place": {"enum": rooms},
                                                                      "n": {"type": "integer", "maximum": 3}},
                                     "required": ["place"], "additionalProperties": False}},
        {"name": "c", "parameters": {"type": "object", "properties": {"room": {"enum": rooms + ["hall"]}},
                                     "additionalProperties": False}},
    ]
    for backend in ("cython", "python"):
        G.clear_caches()
        g = compile_tools(tools, backend=backend)

        def ok(calls):
            return g.accepts(json.dumps(calls, separators=(",", ":")).encode())

        assert ok([{"name": "a", "arguments": {"room": "kids room"}}])
        assert ok([{"name": "b", "arguments": {"place": "kitchen", "n": 2}}])
        assert ok([{"name": "c", "arguments": {"room": "hall"}}])
        assert not ok([{"name": "a", "arguments": {"room": "hall"}}])       # c's enum does not leak into a
        assert not ok([{"name": "a", "arguments": {"place": "kitchen"}}])   # b's key does not leak into a
        assert not ok([{"name": "b", "arguments": {"room": "kitchen"}}])
        assert not ok([{"name": "b", "arguments": {"place": "kitchen", "n": 4}}])
        # the same parameters under two names: two tools, one fragment
        g2 = compile_tools([{"name": "x", "parameters": tools[0]["parameters"]},
                            {"name": "y", "parameters": tools[0]["parameters"]}], backend=backend)
        assert g2.accepts(b'[{"name":"x","arguments":{"room":"bedroom"}},{"name":"y","arguments":{"room":"kitchen"}}]')
        assert not g2.accepts(b'[{"name":"x","arguments":{"room":"bedroom"}},{"name":"x","arguments":{"room":"kitchen"}}]')


def test_mutating_tools_after_compile():
    tools = [{"name": "t", "parameters": {"type": "object", "properties": {"mode": {"enum": ["on", "off"]}},
                                          "required": ["mode"], "additionalProperties": False}}]
    call = b'[{"name":"t","arguments":{"mode":"eco"}}]'
    g = compile_tools(tools)
    assert not g.accepts(call)
    tools[0]["parameters"]["properties"]["mode"]["enum"].append("eco")
    g2 = compile_tools(tools)
    assert g2 is not g and g2.accepts(call)
    assert not g.accepts(call)                 # a compiled grammar never changes
    tools[0]["parameters"]["properties"]["mode"]["enum"].remove("eco")
    assert not compile_tools(tools).accepts(call)
    # renaming a tool is a new set too
    tools[0]["name"] = "u"
    g3 = compile_tools(tools)
    assert g3.accepts(b'[{"name":"u","arguments":{"mode":"on"}}]')
    assert not g3.accepts(b'[{"name":"t","arguments":{"mode":"on"}}]')


def test_same_set_is_served_from_the_cache():
    tools = _catalogue()
    g = compile_tools(tools)
    assert compile_tools(copy.deepcopy(tools)) is g
    assert compile_tools(tools, max_calls=2) is not g


def test_linked_catalogue_cython_equals_reference():
    tools = _catalogue()
    gc = compile_tools(tools)
    gp = compile_tools(tools, backend="python")
    rng = random.Random(21)
    _same_language(gc, gp, [_walk(rng, gc, noise=0.05) for _ in range(12)] + _dev_calls(10))


def test_one_tool_set_equals_its_schema():
    """A tool's arguments in a linked set are exactly its parameters' language."""
    tools = _catalogue()
    rng = random.Random(8)
    g = compile_tools(tools)
    for t in rng.sample(tools, 5):
        gs = compile_schema(t["parameters"])
        head = b'[{"name":"' + t["name"].encode() + b'","arguments":'
        for _ in range(6):
            data = _walk(rng, gs, max_len=80, noise=0.05)
            s, ss = g.start(), gs.start()
            assert s.feed(head)
            for i in range(len(data)):
                a, b = s.feed(data[i:i + 1]), ss.feed(data[i:i + 1])
                assert a == b, (t["name"], data[: i + 1])
                if not a:
                    break
            else:
                if ss.is_complete():
                    assert s.clone().feed(b"}]") or s.clone().feed(b"}")


@pytest.mark.parametrize("bad", [
    "not a list", [{"description": "no name"}], [{"name": "a", "parameters": 3}],
])
def test_bad_tool_sets_still_raise(bad):
    from needle_cy.errors import SchemaError
    with pytest.raises(SchemaError):
        compile_tools(bad)


def test_class_form_operations_keep_their_meaning():
    """complement / intersection / pruning work on the class form: check them by running
    the automata on random strings against Python's own reading of the patterns."""
    import re
    rng = random.Random(2)
    pats = [r"^[A-Z][a-z]*\d?$", r"^(ab|cd)+$", r"x[B-D]y"]
    dfas = [regex.regex_dfa(p) for p in pats]

    def acc(d, s):
        st = d.run(s)
        return st >= 0 and d.accept[st] >= 0

    for _ in range(400):
        s = bytes(rng.choice(b"ABCDEabcdxyz09") for _ in range(rng.randint(0, 6)))
        want = [re.search(p, s.decode()) is not None for p in pats]
        for d, w in zip(dfas, want):
            assert acc(d, s) == w and acc(automata.complement_dfa(d), s) == (not w), s
        assert acc(automata.intersect_dfas(dfas[:2]), s) == (want[0] and want[1]), s


def test_literal_trie_labels():
    """The sorted-order trie: exact strings get their (last) label, others the sink's or none."""
    rng = random.Random(0)
    for _ in range(300):
        strs = [bytes(rng.choice(b"abc") for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 8))]
        labels = [rng.randint(0, 5) for _ in strs] if rng.random() < 0.5 else None
        other = rng.choice([None, 7])
        d = automata._literal_dfa(strs, labels, other)
        for _ in range(40):
            s = bytes(rng.choice(b"abcd") for _ in range(rng.randint(0, 6)))
            st = d.run(s)
            got = int(d.accept[st]) if st >= 0 else -1
            if s in strs:
                want = 0 if labels is None else labels[max(i for i, x in enumerate(strs) if x == s)]
            else:
                want = -1 if other is None else other
            assert got == want, (strs, labels, other, s)


def test_program_classes_are_the_common_refinement():
    """Two bytes share a program class iff every automaton's class map agrees on them (the
    single-map, mixed-radix and hashed paths)."""
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 8, 9, 30]:
        for _ in range(8):
            maps = []
            for _ in range(n):
                k = int(rng.integers(1, 257))
                maps.append(np.unique(rng.integers(0, k, 256), return_inverse=True)[1].reshape(-1).astype(np.uint8))
            byte_class, first = program._program_classes(np.concatenate(maps))
            stacked = np.stack(maps)
            same = (stacked[:, :, None] == stacked[:, None, :]).all(axis=0)
            assert np.array_equal(byte_class[:, None] == byte_class[None, :], same)
            assert np.array_equal(byte_class[first], np.arange(len(first)))


def test_a_tool_whose_parameters_do_not_compile_is_named_with_what_to_do():
    from needle_cy import SchemaError, UnsupportedSchemaError
    ok = {"name": "ok", "parameters": {"type": "object"}}
    tagger = {"name": "tagger", "parameters": {"type": "object", "properties": {
        "tags": {"type": "array", "unevaluatedItems": False}}}}
    with pytest.raises(UnsupportedSchemaError, match=r"^tool 'tagger', in its parameters: keyword 'unevaluatedItems' "
                                                     r"is not supported \(at #/properties/tags\); remove that keyword") as info:
        compile_tools([ok, tagger])
    assert info.value.keyword == "unevaluatedItems" and info.value.pointer == "#/properties/tags/unevaluatedItems"
    negative = {"name": "neg", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "minLength": -1}}}}
    with pytest.raises(SchemaError, match=r"^tool 'neg', in its parameters: minLength .*must be a non-negative "
                                          r"integer.*; correct the tool's parameters$"):
        compile_tools([negative, ok])


def test_anchors_inside_a_pattern():
    """'^' and '$' inside a pattern ("($|/)", "(^|,)") are assertions on the position.  ECMA's
    '$' is the end of the input (Python's \\Z), Python's also holds before a final newline:
    "both" mode is ECMA's reading (what both engines match), "either" mode Python's."""
    import itertools
    import re
    pats = [r"^(a|$)b?", r"(^|,)a", r"^([^,]|$)", r"^(\/?((\.{2})|([a-z\-]*))($|\/))*$", r"a$|(b$)c?",
            r"(a$)*", r"(?:x|^)y($|z)", r"a(\n|$)", r"^(a*$|b)\n?"]
    strings = [""] + ["".join(p) for n in range(1, 5) for p in itertools.product("ab,/.\nyz", repeat=n)][::7]

    def acc(d, s):
        st = d.run(s.encode())
        return st >= 0 and d.accept[st] >= 0

    for p in pats:
        both, either = regex.regex_dfa(p, mode="both"), regex.regex_dfa(p, mode="either")
        assert regex.regex_sensitive(p) == ("$" in p)    # only "$" is read differently
        for s in strings:
            py = re.search(p, s) is not None
            ecma = re.search(p.replace("$", r"\Z"), s) is not None
            assert acc(both, s) == (py and ecma), (p, s)
            assert acc(either, s) == (py or ecma), (p, s)
    for bad in (r"a^*", r"a$?", r"(a|$+)"):   # an assertion cannot be repeated (a group holding one can)
        with pytest.raises(UnsupportedSchemaError, match="quantifier after"):
            regex.regex_dfa(bad)
