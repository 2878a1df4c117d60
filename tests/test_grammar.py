"""Grammar: per-keyword accept/reject, tool-call language, Cython ≡ reference, token level.

Every expectation about a JSON value is also checked against the ``jsonschema``
library (the oracle), so a wrong expectation here fails loudly instead of
blessing a wrong grammar.
"""
import json
import random
import decimal
from decimal import Decimal

import jsonschema
import numpy as np
import pytest

from conftest import fixture_path
from grammar_helpers import oracle_validator_class, random_walk
from needle_cy.testing.sentencepiece_pieces import sentencepiece_piece_table
from needle_cy.errors import GrammarLimitError, SchemaError, UnsupportedSchemaError
from needle_cy.grammar import compile_schema, compile_tools

BACKENDS = ["cython", "python"]


class Raw:
    """A literal byte text (not a Python value to serialise)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return f"Raw({self.text!r})"


class Exact(Raw):
    """Raw text valid under exact decimal arithmetic (not checked against jsonschema's floats)."""


def text_of(v):
    if isinstance(v, Raw):
        return v.text.encode("utf-8") if isinstance(v.text, str) else v.text
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def oracle(schema, v):
    """jsonschema's verdict (format checking on) for a Python value; None for raw texts it can't see."""
    if isinstance(v, Raw):
        try:
            v = json.loads(v.text)
        except (ValueError, TypeError):
            return False
    cls = oracle_validator_class(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(v)


# (schema, accepted, rejected); Raw(...) = exact bytes.  Raw texts that are valid JSON but
# rejected are grammar-level refusals (non-compact, duplicate keys, lone surrogates...).
CASES = [
    # type / literals
    ({"type": "null"}, [None], [False, 0, "", Raw("nul"), Raw(" null")]),
    ({"type": "boolean"}, [True, False], [None, 1, "true"]),
    ({"type": ["string", "null"]}, ["a", None], [1, True, []]),
    ({"type": "integer"}, [0, -5, 12345678901234567890], [1.5, "1", Raw("01"), Raw("-"), Raw("1.0"), Raw("-01")]),
    ({"type": "number"}, [0, -0.5, 1e-05, 1.5e300, Raw("-0"), Raw("2E+3")], ["1", Raw(".5"), Raw("1."), Raw("1e"),
                                                                       Raw("+1"), Raw("0x1")]),
    (True, [1, "a", None, {"a": [1, {}]}], [Raw("{"), Raw("[1,]"), Raw("{ }")]),
    (False, [], [1, None, {}]),
    # enum / const
    ({"enum": ["red", "green", 3, None, [1, 2], {"a": 1}]},
     ["red", "green", 3, Raw("3.0"), None, [1, 2], {"a": 1}], ["blue", "re", 4, [1], {"a": 2}, {"a": 1, "b": 1}]),
    ({"const": "x\u00e9"}, ["x\u00e9", Raw('"x\\u00e9"')], ["x", "xe"]),
    ({"type": "string", "enum": ["a", 1]}, ["a"], [1]),
    # strings
    ({"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "abc", "\U0001d11e\U0001d11e", "é€"],
     ["a", "abcd", "\U0001d11e"]),
    ({"type": "string"}, ["", "a\"b\\c\n", "\u20ac\U0001f600", Raw('"\\ud83d\\ude00"'), Raw('"\\/"')],
     [Raw('"\\ud83d"'), Raw('"\\ude00"'), Raw('"a\nb"'), Raw('"\\x"'), Raw(b'"\xff"'), Raw(b'"\xc0\x80"'),
      Raw(b'"\xed\xa0\x80"'), Raw('"\\u12"')]),
    ({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"}, ["ab-12", "x-123"], ["ab-1", "Ab-12", "ab-1234", "ab12"]),
    ({"type": "string", "pattern": "cat|dog"}, ["a cat!", "dog", "hotdogs"], ["cow", "ca t"]),
    ({"type": "string", "pattern": "^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$"}, ["555-1212", "(888)555-1212"],
     ["(888)555-121", "555-12123"]),
    ({"type": "string", "pattern": "^[^\\s@]+@[^\\s@]+$"}, ["a@b", "é@x"], ["a @b", "a@", "@b"]),
    ({"type": "string", "pattern": "^\\w+$"}, ["abc_1"], ["a-b", ""]),
    ({"type": "string", "format": "date"}, ["2024-02-28", "1999-12-31"], ["2024-02-30", "2024-13-01", "24-01-01"]),
    ({"type": "string", "format": "date-time"}, ["2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123+01:00"],
     ["2024-01-02 03:04:05Z", "2024-01-02T25:04:05Z", "2024-01-02T03:04:05"]),
    ({"type": "string", "format": "time"}, ["23:59:59Z", "00:00:00+05:30"], ["24:00:00Z", "12:00"]),
    ({"type": "string", "format": "email"}, ["joe@example.com", "a.b+c@x-y.org"], ["joe", "joe@", "@x.com", "a@-x.com"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"],
     ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400"]),
    ({"type": "string", "format": "ipv4"}, ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "1.2.3", "01.2.3.4"]),
    ({"type": "string", "format": "uri"}, ["https://example.com/a?b=c#d", "urn:isbn:123"], ["example.com", "ht tp://x"]),
    ({"type": "string", "format": "int32"}, ["anything"], [1]),
    # numbers
    ({"type": "integer", "minimum": 0, "maximum": 100}, [0, 7, 100], [-1, 101, 1000, 50.5]), ({"type": "integer", "minimum": 0}, [Raw("-0")], [Raw("-1")]),
    ({"type": "integer", "minimum": -10, "maximum": -2}, [-10, -2, -5], [-1, 0, -11, 3]),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0.5, 1e-9, Raw("0.999")], [0, 1, -0.1, 1.5]),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0,
      "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": False}, [0.1, 5], [0, 5.1]),
    ({"type": "number", "multipleOf": 0.5, "minimum": 5, "maximum": 30}, [5, 5.5, 30, Raw("2.05e1"), Raw("6.50")],
     [4.5, 5.25, 30.5, Raw("5.05")]),
    # exact decimals: 0.07 is a multiple of 0.01 (jsonschema's float division says otherwise: 7.000000000000001)
    ({"type": "number", "multipleOf": 0.01}, [Exact("0.07"), Exact("19.99"), 3, Raw("1e-2")], [0.001, 19.995, Raw("1e-3")]),
    ({"type": "integer", "multipleOf": 7}, [0, 14, -21, 700000000000000000007 * 7], [1, 15]),
    ({"type": "number", "minimum": 1e-3}, [0.001, Raw("1E-3"), 2], [0.0009, Raw("-1e5")]),
    # arrays
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}, [[1], [1, 2, 3]],
     [[], [1, 2, 3, 4], ["a"], Raw("[1 ]"), Raw("[1,]")]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, [[], ["a"], ["a", 1]],
     [["a", 1, 2], [1], ["a", "b"]]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"type": "string"}],
      "additionalItems": {"type": "integer"}}, [["a", 1, 2], []], [["a", "b"], [1]]),
    ({"type": "array", "maxItems": 0}, [[]], [[1], [[]]]),
    ({"type": "array", "uniqueItems": True}, [[1, 2], ["1", 1], [[1], [2]], [{"a": 1}, {"a": 2}], [True, 1]],
     [[1, 1], Raw("[1,1.0]"), [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[1, 2], [1, 2]], ["x", "x"], [None, None],
      Raw('["\\u0061","a"]')]),
    # objects
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"],
      "additionalProperties": False}, [{"a": "x"}, {"b": 1, "a": "y"}],
     [{}, {"a": 1}, {"a": "x", "c": 1}, {"b": 1}, Raw('{"a":"x","a":"y"}'), Raw('{"a" :"x"}')]),
    ({"type": "object", "properties": {"room": {"type": "integer"}}}, [{"ro": "x"}, {"room": 1}, {"rooms": "a"}],
     [{"room": "x"}, Raw('{"q":1,"q":2}')]),
    ({"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 2},
     [{"x": True}, {"x": True, "y": False}], [{}, {"x": 1}, {"a": True, "b": True, "c": True}]),
    ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
     [{"x-a": 1}, {}], [{"x-a": "s"}, {"y": 1}]),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
      "dependencies": {"card": ["billing"], "x": {"required": ["y"]}}},
     [{}, {"billing": 1}, {"card": 1, "billing": 2}, {"y": 1}], [{"card": 1}, {"x": 1}]),
    ({"dependentRequired": {"a": ["b", "c"]}}, [{"a": 1, "b": 1, "c": 1}, 5], [{"a": 1, "b": 2}]),
    ({"dependentSchemas": {"a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}}},
     [{}, {"b": 1}, {"a": 1, "b": "x"}, 3], [{"a": 1}, {"a": 1, "b": 2}]),
    ({"$schema": "http://json-schema.org/draft-07/schema#",
      "dependencies": {"a": {"properties": {"b": {"type": "string"}}}, "c": ["a"]}},
     [{"a": 1, "b": "x"}, {"c": 1, "a": 2}], [{"a": 1, "b": 2}, {"c": 1}]),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, [{"ab": 1}], [{"aB": 1}, {"1": 2}]),
    ({"type": "object", "properties": {"k": {"type": "string"}},
      "patternProperties": {"k": {"maxLength": 2}}}, [{"k": "ab"}, {"kk": 5}], [{"k": "abc"}, {"kk": "abc"}]),
    # $ref, recursion
    ({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
                         "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{}, {"v": 1, "next": {"next": {"v": 2}}}], [{"next": 1}, {"next": {"w": 1}}]),
    ({"definitions": {"s": {"type": "string"}}, "type": "array", "items": {"$ref": "#/definitions/s"}},
     [["a"]], [[1]]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}},
     [{"b": 2}], [{"b": "x"}]),
    # combinators
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, [5, "ab"], ["abc", None]),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 10}]}, [5, 10.5], [20, "x"]),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     [{"a": 1}, {"b": 2}], [{"a": 1, "b": 2}, {}]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "x"}], [{"a": 1}, {"b": "x"}, {"a": "1", "b": "x"}]),
    ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}, {"maxLength": 3}]}, ["ab", "ba"],
     ["a", "b", "abab"]),
    ({"allOf": [{"type": "object", "additionalProperties": False, "properties": {"a": {}}},
                {"properties": {"b": {}}}]}, [{"a": 1}, {}], [{"b": 1}]),
    ({"type": "integer", "allOf": [{"minimum": 3}, {"maximum": 5}], "anyOf": [{"multipleOf": 2}, {"multipleOf": 5}]},
     [4, 5], [3, 6, 10]),
    ({"allOf": [{"enum": [1, 2, 3]}, {"not": {"const": 2}}]}, [1, 3], [2, 4]),
    ({"not": {"type": "string"}}, [1, None, {}], ["a"]),
    ({"type": "object", "if": {"required": ["kind"], "properties": {"kind": {"const": "a"}}},
      "then": {"required": ["a"]}, "else": {"required": ["b"]}},
     [{"kind": "a", "a": 1}, {"kind": "x", "b": 1}, {"b": 1}], [{"kind": "a", "b": 1}, {"kind": "x"}, {}]),
    ({"if": {"type": "number", "minimum": 5}, "then": {"maximum": 10}}, [3, 5, 10, "a"], [11]),
    ({"if": {"type": "string"}, "else": {"type": "integer"}}, ["a", 3], [1.5, None]),
]


def _id(case):
    return json.dumps(case[0])[:60]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_keyword(case, backend):
    schema, good, bad = case
    g = compile_schema(schema, backend=backend)
    for v in good:
        if not isinstance(v, Exact):
            assert oracle(schema, v), f"test expectation wrong: {v!r} is invalid for {schema}"
        assert g.accepts(text_of(v)), f"valid {text_of(v)!r} refused by {schema}"
    for v in bad:
        # (format checkers of jsonschema need optional packages; the grammar's rules are documented)
        if not isinstance(v, Raw) and not (isinstance(schema, dict) and "format" in schema):
            assert not oracle(schema, v), f"test expectation wrong: {v!r} is valid for {schema}"
        assert not g.accepts(text_of(v)), f"invalid {text_of(v)!r} accepted by {schema}"


def test_earliest_byte():
    """A violating byte is refused at once, not at the end of the value."""
    g = compile_schema({"type": "object", "properties": {"room": {"type": "integer", "maximum": 50}},
                        "required": ["room"], "additionalProperties": False})
    s = g.start()
    assert s.feed(b'{"ro')
    assert not s.clone().feed(b"x")            # no declared property starts with "rox"
    assert s.feed(b'om":')
    assert not s.clone().feed(b'"')            # integer only
    s2 = s.clone()
    assert s2.feed(b"5") and not s2.clone().feed(b"1")   # 51 > 50, and 51x longer is larger still
    assert not s.clone().feed(b"}")            # required missing: '}' comes after the value only
    assert s.feed(b"7") and s.feed(b"}") and s.is_complete()
    # a used property cannot be started again
    g2 = compile_schema({"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False})
    s = g2.start()
    assert s.feed(b'{"a":1,"')
    assert not s.clone().feed(b"a")
    assert s.feed(b'b":2')
    assert not s.clone().feed(b",")            # no key left to write


def test_unsupported_errors_name_keyword_and_pointer():
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"type": "object", "properties": {"x": {"allOf": [{"contains": {"type": "string"}},
                                                                        {"contains": {"type": "null"}}]}}})
    assert e.value.keyword == "contains" and e.value.pointer.startswith("#/properties/x/allOf/")
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"type": "object", "properties": {"x": {"contains": {"format": "email"}, "maxContains": 2}}})
    assert e.value.keyword == "maxContains" and e.value.pointer == "#/properties/x/maxContains"
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"if": {"multipleOf": 2}, "then": {"minimum": 10}})
    assert e.value.keyword == "not"
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"$ref": "http://example.com/schema.json"})
    assert e.value.keyword == "$ref"
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"type": "string", "pattern": "(?=a)b"})
    assert e.value.keyword == "pattern"
    with pytest.raises(UnsupportedSchemaError) as e:
        compile_schema({"not": {"multipleOf": 2}})
    assert e.value.keyword == "not" and e.value.pointer == "#/not/multipleOf"
    with pytest.raises(UnsupportedSchemaError) as e:      # narrowed: its complement is not exact
        compile_schema({"not": {"type": "string", "format": "hostname"}})
    assert e.value.keyword == "not"
    with pytest.raises(UnsupportedSchemaError) as e:      # its length bound needs a string node
        compile_schema({"propertyNames": {"format": "hostname"}})
    assert e.value.keyword == "format"
    with pytest.raises(SchemaError):
        compile_schema({"type": "strin"})
    with pytest.raises(SchemaError):
        compile_schema({"$ref": "#/definitions/missing"})
    with pytest.raises(GrammarLimitError):
        compile_schema({"type": "string", "pattern": "^a{5000}$"})
    # annotations and unknown non-validation keywords are fine
    compile_schema({"type": "string", "title": "t", "description": "d", "examples": ["x"], "default": "x",
                    "$comment": "c", "x-vendor": 1})


def test_recursion_depth_is_bounded():
    g = compile_schema({"type": "array", "items": {"$ref": "#"}})
    assert g.accepts(b"[[[]]]")
    deep = b"[" * 200 + b"]" * 200
    assert not g.accepts(deep)  # beyond the frame stack: refused, never a crash


# ----------------------------------------------------------------------------- tool calls

TOOLS = [
    {"name": "set_light", "description": "", "parameters": {
        "type": "object", "properties": {"room": {"type": "string", "enum": ["kitchen", "hall"]},
                                         "on": {"type": "boolean"}}, "required": ["room", "on"]}},
    {"name": "set_timer", "description": "", "parameters": {
        "type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1}}, "required": ["minutes"],
        "additionalProperties": False}},
    {"name": "set", "description": "", "parameters": {"type": "object", "properties": {}}},
]


def call(name, args):
    return {"name": name, "arguments": args}


@pytest.mark.parametrize("backend", BACKENDS)
def test_tool_calls(backend):
    g = compile_tools(TOOLS, max_calls=2, backend=backend)

    def ok(calls):
        return g.accepts(json.dumps(calls, separators=(",", ":")).encode())

    assert ok([])
    assert ok([call("set_light", {"room": "kitchen", "on": True})])
    assert ok([call("set_timer", {"minutes": 5}), call("set", {})])
    assert ok([call("set", {}), call("set_light", {"on": False, "room": "hall"})])
    assert not ok([call("set", {}), call("set", {})])                          # repeated tool
    assert not ok([call("set", {}), call("set_timer", {"minutes": 1}), call("set_light", {"room": "hall", "on": True})])
    assert not ok([call("set_lights", {})])                                    # unknown name
    assert not ok([call("set_timer", {"room": "kitchen", "on": True})])        # another tool's keys
    assert not ok([call("set_timer", {"minutes": 0})])
    assert not ok([{"arguments": {}, "name": "set"}])                          # fixed key order
    assert not g.accepts(b'[{"name":"set","arguments":{}} ]')
    assert not g.accepts(b"")
    s = g.start()
    assert s.feed(b'[{"name":"set_timer","arguments":{"minutes":3}},{"name":"set')
    assert not s.clone().feed(b'_t')      # set_timer is used: the prefix is dead at once
    assert s.clone().feed(b'_l') and s.clone().feed(b'"')


def test_tool_call_limits():
    g = compile_tools(TOOLS, max_calls=0)
    assert g.accepts(b"[]") and not g.accepts(b'[{"name":"set","arguments":{}}]')
    with pytest.raises(SchemaError):
        compile_tools([{"name": "a b", "parameters": {}}])
    with pytest.raises(SchemaError):
        compile_tools([{"name": "a", "parameters": {}}, {"name": "a", "parameters": {}}])


def test_in_string():
    g = compile_tools(TOOLS)
    s = g.start()
    s.feed(b'[{"name":"set_light","arguments":{"room":"')
    assert not s.in_string()  # an enum string is not free text (its automaton bounds it)
    g2 = compile_schema({"type": "object", "properties": {"q": {"type": "string"}}})
    s = g2.start()
    assert s.feed(b'{"q') and not s.in_string()   # keys are not string values
    assert s.feed(b'":"ab') and s.in_string()
    assert s.feed(b'"') and not s.in_string()


# ----------------------------------------------------------------------------- Cython ≡ reference

FUZZ_SCHEMAS = [c[0] for c in CASES] + [{"type": "array", "items": t["parameters"]} for t in TOOLS]
ALPHABET = b'{}[],:"\\-+.0123456789eEtrufalsnbxyz \n\xc3\xa9\xe2\x82\xacu'


def _random_bytes(rng, g, max_len=40):
    """Mostly-valid byte streams over ALPHABET (sometimes any byte)."""
    return random_walk(rng, g, ALPHABET, max_len=max_len, noise=0.15)


def test_cython_equals_reference_on_byte_streams():
    rng = random.Random(1234)
    for schema in FUZZ_SCHEMAS:
        gc = compile_schema(schema, backend="cython")
        gp = compile_schema(schema, backend="python")
        assert gc.backend == "cython"
        for _ in range(12):
            data = _random_bytes(rng, gc)
            sc, sp = gc.start(), gp.start()
            for i in range(len(data)):
                a, b = sc.feed(data[i:i + 1]), sp.feed(data[i:i + 1])
                assert a == b, (schema, data[: i + 1])
                if not a:
                    break
                assert sc.is_complete() == sp.is_complete(), (schema, data[: i + 1])
                assert sc.in_string() == sp.in_string()


# ----------------------------------------------------------------------------- token level

@pytest.fixture(scope="module")
def pieces():
    return sentencepiece_piece_table(fixture_path("needle3_tiny_a", "tokenizer.model"))[1]


def test_allowed_tokens_matches_brute_force(pieces):
    rng = random.Random(7)
    schemas = [TOOLS, {"type": "object", "properties": {"q": {"type": "string", "maxLength": 4},
                                                        "n": {"type": "number"}}},
               {"type": "array", "items": {"anyOf": [
                   {"type": "string", "pattern": "^[a-f0-9 ]*$", "maxLength": 6},
                   {"enum": ["kitchen", "hall", "k\u00e9"]}, {"type": "string", "format": "date"}]}}]
    for sch in schemas:
        gc = compile_tools(sch) if isinstance(sch, list) else compile_schema(sch)
        gp = compile_tools(sch, backend="python") if isinstance(sch, list) else compile_schema(sch, backend="python")
        sc = gc.start()
        for _ in range(40):
            mask_c = gc.allowed_tokens(sc, pieces)
            # brute force with the Cython state, and the reference grammar on a sample of pieces
            ids = np.flatnonzero(mask_c)
            brute = np.array([bool(p) and sc.clone().feed(p) for p in pieces])
            assert (mask_c == brute).all()
            if not len(ids):
                break
            tok = int(rng.choice(ids))
            assert sc.feed(pieces[tok])
        del gp


def test_best_allowed(pieces):
    rng = np.random.default_rng(0)
    g = compile_tools(TOOLS)
    s = g.start()
    for _ in range(60):
        logits = rng.standard_normal(len(pieces)).astype(np.float32)
        tok, s2 = g.best_allowed(s, logits, pieces)
        mask = g.allowed_tokens(s, pieces)
        if tok < 0:
            assert not mask.any()
            break
        assert mask[tok]
        assert logits[tok] == logits[mask].max()
        s = s2
        if s.is_complete():
            break
    # the arg-max fast path returns the same as the walk
    s = g.start()
    logits = np.zeros(len(pieces), np.float32)
    logits[pieces.index(b"[") if b"[" in pieces else 0] = 5.0
    tok, s2 = g.best_allowed(s, logits, pieces)
    assert g.allowed_tokens(s, pieces)[tok]


def test_best_allowed_close_string(pieces):
    g = compile_schema({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
    s = g.start()
    assert s.feed(b'{"q":"abc')
    logits = np.zeros(len(pieces), np.float32)
    tok, s2 = g.best_allowed(s, logits, pieces, close_string=True)
    assert tok >= 0 and b'"' in pieces[tok] and not s2.in_string()


def _has_inf(v):
    if isinstance(v, float):
        return v in (float("inf"), float("-inf"))
    if isinstance(v, dict):
        return any(_has_inf(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_inf(x) for x in v)
    return False


def test_random_walks_validate(pieces):
    """Random allowed tokens until complete: every result is valid JSON for the schema."""
    rng = np.random.default_rng(3)
    schemas = [c[0] for c in CASES if isinstance(c[0], dict) and "$schema" not in c[0]][:40]
    for schema in schemas:
        g = compile_schema(schema)
        for _ in range(2):
            s = g.start()
            out = b""
            for _ in range(60):
                if s.is_complete() and rng.random() < 0.3:
                    break
                mask = g.allowed_tokens(s, pieces)
                ids = np.flatnonzero(mask)
                if not len(ids):
                    break
                tok = int(rng.choice(ids))
                assert s.feed(pieces[tok])
                out += pieces[tok]
            if s.is_complete():
                value = json.loads(out)
                if _has_inf(value):
                    # a number past float range (e.g. 1E999): jsonschema's float arithmetic
                    # cannot judge it, so the exact-decimal reference grammar must agree instead
                    assert compile_schema(schema, backend="python").accepts(out), (schema, out)
                    continue
                assert oracle(schema, value), (schema, out)


# ----------------------------------------------------------------------------- random schemas

def random_schema(rng, depth=0):
    """A random schema over the supported keywords (values kept float-exact for the oracle)."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum"]
    if depth < 3:
        kinds += ["object", "object", "array", "anyOf", "oneOf", "allOf"]
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        if rng.random() < 0.4:
            s["maxLength"] = rng.randint(0, 6)
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["pattern"] = rng.choice(["^[a-c]*$", "^x", "b", "^[0-9]{2,4}$", "^(ab|cd)+$", "^\\w*$", "^[^a]*$"])
        return s
    if k in ("integer", "number"):
        s = {"type": k}
        if rng.random() < 0.5:
            s["minimum"] = rng.randint(-20, 10)
        if rng.random() < 0.5:
            s["maximum"] = rng.randint(10, 2000)
        if rng.random() < 0.3:
            s["multipleOf"] = rng.choice([2, 3, 5, 0.5, 0.25]) if k == "number" else rng.choice([2, 3, 7])
        if rng.random() < 0.2:
            s["exclusiveMinimum"] = rng.randint(-30, 0)
        return s
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        pool = ["a", "b", "ab", "é", 1, 2.5, -3, True, None, [1, "x"], {"k": 1}]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if k == "object":
        names = rng.sample(["a", "b", "ab", "abc", "x", "y_z", "é"], rng.randint(0, 4))
        s = {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names}}
        if names and rng.random() < 0.6:
            s["required"] = rng.sample(names, rng.randint(1, len(names)))
        r = rng.random()
        if r < 0.4:
            s["additionalProperties"] = False
        elif r < 0.55:
            s["additionalProperties"] = random_schema(rng, depth + 1)
        if rng.random() < 0.15:
            s["patternProperties"] = {"^p": {"type": "integer"}}
        if rng.random() < 0.15:
            s["maxProperties"] = rng.randint(1, 3)
        if rng.random() < 0.1:
            s["minProperties"] = 1
        return s
    if k == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.3:
            s["prefixItems"] = [random_schema(rng, depth + 1)]
        if rng.random() < 0.4:
            s["maxItems"] = rng.randint(0, 4)
        if rng.random() < 0.3:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.3:
            s["uniqueItems"] = True
        return s
    subs = [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]
    return {k: subs}


def test_random_schemas_random_walks(pieces):
    """Random schemas, random token walks: whatever completes validates with jsonschema."""
    rng = random.Random(11)
    nrng = np.random.default_rng(11)
    completed = 0
    for _ in range(150):
        schema = random_schema(rng)
        try:
            g = compile_schema(schema)
        except (UnsupportedSchemaError, GrammarLimitError):
            continue
        gp = compile_schema(schema, backend="python")
        for _ in range(3):
            s = g.start()
            out = b""
            for _ in range(40):
                if s.is_complete() and nrng.random() < 0.4:
                    break
                ids = np.flatnonzero(g.allowed_tokens(s, pieces))
                if not len(ids):
                    break
                tok = int(nrng.choice(ids))
                assert s.feed(pieces[tok])
                out += pieces[tok]
            if s.is_complete():
                completed += 1
                # decimals parsed exactly (1e999 is a valid JSON number, not a float); exponents
                # beyond Decimal's range cannot be checked by the oracle
                with decimal.localcontext() as ctx:
                    ctx.Emax, ctx.Emin, ctx.prec = decimal.MAX_EMAX, decimal.MIN_EMIN, 4000
                    exact_schema = json.loads(json.dumps(schema), parse_float=Decimal)
                    try:
                        verdict = oracle(exact_schema, json.loads(out, parse_float=Decimal))
                    except decimal.DecimalException:
                        verdict = None   # e.g. 1e-9999999 % 0.5: beyond what Decimal can divide
                    assert verdict is not False, (schema, out)
                assert gp.accepts(out), (schema, out)   # the reference agrees
    assert completed >= 80


NOT_CASES = [
    ({"not": {"not": {"type": "integer"}}}, [1], ["a", 1.5]),
    ({"not": {"required": ["a"]}}, [{}, {"b": 1}], [{"a": 1}, 1, "x"]),
    ({"type": "object", "not": {"required": ["a", "b"]}}, [{"a": 1}, {"b": 1}], [{"a": 1, "b": 2}]),
    ({"type": "string", "not": {"enum": ["a", "b"]}}, ["c", "ab", ""], ["a", "b"]),
    ({"not": {"enum": ["a", True]}}, ["c", False, None, 1, {}], ["a", True]),
    ({"not": {"enum": [1, 2.5, "x"]}}, [0, 2, 2.4, 3, "y", None, []], [1, Raw("1.0"), 2.5, Raw("25e-1"), "x"]),
    ({"type": "string", "not": {"pattern": "^x"}}, ["ax", ""], ["x", "xy"]),
    ({"not": {"pattern": "^x"}}, [], ["x", 1, None]),
    ({"not": {"minimum": 3}}, [2, 2.99, -1], [3, 4, "a"]),
    ({"type": "integer", "not": {"exclusiveMaximum": 3}}, [3, 4], [2]),
    ({"not": {"anyOf": [{"type": "string"}, {"type": "boolean"}]}}, [1, None, []], ["a", True]),
    ({"not": {"allOf": [{"type": "string"}, {"maxLength": 2}]}}, ["abc", 1], ["ab", ""]),
    ({"type": "array", "not": {"maxItems": 1}}, [[1, 2]], [[], [1]]),
    ({"not": {"$ref": "#/$defs/s"}, "$defs": {"s": {"type": "string"}}}, [1], ["a"]),
    ({"not": {"properties": {"a": {"type": "string"}, "b": {"const": 1}}}}, [{"a": 1}, {"b": 2}],
     [{}, {"a": "x"}, {"b": 1}, 5]),
    ({"type": "string", "not": {"format": "date"}}, ["2024-02-30", "x"], ["2024-01-01"]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", NOT_CASES, ids=[_id(c) for c in NOT_CASES])
def test_not(case, backend):
    test_keyword(case, backend)


# ----------------------------------------------------------------------------- \u escapes vs automata
# A violating byte is rejected at the earliest byte where no valid completion remains,
# also inside a \u escape of a string bounded by an automaton (fixed keys, enums, tool names).

def _feed(g, data):
    s = g.start()
    ok = s.feed(data)
    return ok, ok and s.is_complete()


ESCAPE_KEY_SCHEMA = {"type": "object", "properties": {"scene": {"type": "string"}}, "required": ["scene"],
                     "additionalProperties": False}


@pytest.mark.parametrize("backend", BACKENDS)
def test_unicode_escape_in_fixed_key_rejected_early(backend):
    g = compile_schema(ESCAPE_KEY_SCHEMA, backend=backend)
    assert _feed(g, b'{"s\\ua') == (False, False)        # U+Axxx is never 'c'
    assert _feed(g, b'{"s\\u1') == (False, False)
    assert _feed(g, b'{"s\\u0064') == (False, False)     # 'd'
    assert _feed(g, b'{"s\\ud8') == (False, False)       # no astral key
    assert _feed(g, b'{"scene\\') == (False, False)      # nothing may follow the full key
    assert _feed(g, b'{"s\\u006')[0]
    assert _feed(g, b'{"s\\u0063')[0]
    assert _feed(g, b'{"s\\u0063ene":"x"}') == (True, True)
    assert _feed(g, b'{"\\u0073\\u0063ene":"x"}') == (True, True)
    # a used key is no longer live: its escaped spelling dies as early as the raw one
    g2 = compile_schema({"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False},
                        backend=backend)
    assert _feed(g2, b'{"a":1,"\\u0062":2}') == (True, True)
    assert _feed(g2, b'{"a":1,"\\u006')[0]              # 'b' remains
    assert _feed(g2, b'{"a":1,"\\u007') == (False, False)
    assert _feed(g2, b'{"a":1,"\\u0061') == (False, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unicode_escape_in_enum_rejected_early(backend):
    g = compile_schema({"enum": ["caf\u00e9", "x\U0001F600y"]}, backend=backend)
    assert _feed(g, b'"caf\\u00e9"') == (True, True)
    assert _feed(g, b'"caf\\u00E9"') == (True, True)
    assert _feed(g, b'"x\\ud83d\\ude00y"') == (True, True)
    assert _feed(g, b'"caf\\u00e')[0]
    assert _feed(g, b'"x\\ud83d\\ude0')[0]
    assert _feed(g, b'"caf\\u01') == (False, False)
    assert _feed(g, b'"caf\\u00e8') == (False, False)
    assert _feed(g, b'"x\\ud83e') == (False, False)      # wrong high surrogate
    assert _feed(g, b'"x\\ud83d\\udf') == (False, False)  # no low surrogate completes it
    assert _feed(g, b'"x\\ud83d\\ude01') == (False, False)
    assert _feed(g, b'"cafe\\') == (False, False)        # dead before any escape letter
    gc = compile_schema({"const": "a/b"}, backend=backend)
    assert _feed(gc, b'"a\\/b"') == (True, True)
    assert _feed(gc, b'"a\\u002')[0]
    assert _feed(gc, b'"a\\u003') == (False, False)
    for s in ("caf\u00e9", "x\U0001F600y"):               # the oracle agrees on the accepted side
        jsonschema.validate(s, {"enum": ["caf\u00e9", "x\U0001F600y"]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_unicode_escape_in_plain_strings_structural(backend):
    g = compile_schema({"type": "string", "maxLength": 1}, backend=backend)
    assert _feed(g, b'"\\u0041"') == (True, True)
    assert _feed(g, b'"a\\') == (False, False)           # no room for another character
    assert _feed(g, b'"\\udc') == (False, False)         # a lone low surrogate can never complete
    assert _feed(g, b'"\\ud800\\u0') == (False, False)   # not a low surrogate
    assert _feed(g, b'"\\ud800\\udc00"') == (True, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unicode_escape_in_tool_name_rejected(backend):
    g = compile_tools(TOOLS, backend=backend)
    assert g.start().feed(b'[{"name":"set_light","arguments":')
    assert g.start().feed(b'[{"name":"set_t')
    # tool names are matched as literal bytes: an escape can never continue one
    assert not g.start().feed(b'[{"name":"set\\u0071')
    assert not g.start().feed(b'[{"name":"set\\ua')
    assert not g.start().feed(b'[{"name":"\\u')


# --- a state carries its grammar's identity ---------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_state_of_another_grammar_is_refused(backend, pieces):
    """A state fed by one grammar, passed to another, once read the other grammar's tables at
    the first one's node/DFA indexes (heap-buffer-overflow in dfa_next, -11)."""
    from needle_cy.errors import GrammarStateError
    from needle_cy import NeedleError
    st = compile_schema({"type": "string", "pattern": "^x+$"}, backend).start()
    assert st.feed(b'"xx')
    other = compile_schema({"type": "integer"}, backend)
    logits = np.zeros(len(pieces), np.float32)
    for call in (lambda s: other.allowed_tokens(s, pieces),
                 lambda s: other.best_allowed(s, logits, pieces),
                 lambda s: other.best_allowed(s, logits, pieces, close_string=True)):
        for bad in (st, st.clone(), None, "state", 5):
            with pytest.raises(GrammarStateError) as info:
                call(bad)
            assert isinstance(info.value, NeedleError)
    # the other backend's state is refused too
    twin = compile_schema({"type": "integer"}, "python" if backend == "cython" else "cython")
    with pytest.raises(GrammarStateError):
        other.allowed_tokens(twin.start(), pieces)
    # its own states still work, clones included
    own = other.start()
    assert own.feed(b"1")
    assert other.allowed_tokens(own.clone(), pieces).any()
    tok, new = other.best_allowed(own, logits, pieces)
    assert tok >= 0 and new is not own
    assert other.allowed_tokens(new, pieces).any() or new.is_complete()
