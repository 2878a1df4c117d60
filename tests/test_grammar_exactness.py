"""False accepts under negation and across drafts, keyword-value errors, internal keywords.

Rule zero: no instance the schema forbids is ever accepted.  Every accept/refuse
expectation below is also checked against ``jsonschema`` (with its format checker), so a
wrong expectation fails loudly.  Each case is a reproducer from the issue or from the fuzz
harness (tests/fuzz), kept as a fixed regression case.
"""
import json

import jsonschema
import pytest

from needle_cy import NeedleError
from needle_cy.errors import GrammarLimitError, SchemaError, UnsupportedSchemaError
from needle_cy.grammar import EXACT_FORMATS, NARROWED_FORMATS, compile_schema

BACKENDS = ["cython", "python"]
D4 = "http://json-schema.org/draft-04/schema#"


def oracle(schema, value):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value)


def text(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# (schema, value, accepted[, "ecma"]): the grammar's answer, which jsonschema must agree
# with -- except the cases marked "ecma": refused because ECMA-262 (the other engine of the
# dialect) forbids them, although Python's re allows them, and "strict": a format enforced
# in a draft that leaves it an annotation (refusing is always safe)
CASES = [
    # a date format is exact: 29 February of a leap year is a date, of 1900 it is not
    ({"type": "string", "format": "date"}, "2024-02-29", True),
    ({"type": "string", "format": "date"}, "2000-02-29", True),
    ({"type": "string", "format": "date"}, "1900-02-29", False),
    ({"type": "string", "format": "date"}, "2023-02-29", False),
    ({"type": "string", "format": "date"}, "0000-01-01", False),
    ({"not": {"type": "string", "format": "date"}}, "2024-02-29", False),
    ({"not": {"type": "string", "format": "date"}}, "2023-02-29", True),
    ({"not": {"format": "date"}}, "1900-02-29", True),
    ({"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^2024"}]}, "2024-02-29", False),
    ({"oneOf": [{"type": "string", "format": "date"}, {"type": "string", "pattern": "^2024"}]}, "2024-02-30", True),
    ({"if": {"format": "date"}, "then": {"maxLength": 5}}, "2024-02-29", False),
    ({"if": {"format": "date"}, "then": {"maxLength": 5}}, "2023-02-29", True),
    ({"not": {"format": "ipv4"}}, "01.2.3.4", True),
    ({"not": {"format": "ipv4"}}, "1.2.3.4", False),
    ({"not": {"format": "uuid"}}, "123e4567-e89b-12d3-a456-426614174000", False),
    # a narrowed format where the types keep alternatives apart is still fine
    ({"oneOf": [{"type": "string", "format": "email"}, {"type": "null"}]}, "a@b.co", True),
    ({"oneOf": [{"type": "string", "format": "email"}, {"type": "null"}]}, None, True),
    # draft-4 integers: 1.0 is not an integer there, with or without an enum
    ({"$schema": D4, "type": "integer", "enum": [1]}, 1.0, False),
    ({"$schema": D4, "type": "integer", "enum": [1]}, 1, True),
    ({"$schema": D4, "type": "integer", "enum": [1.0, 2]}, 1, True),
    ({"$schema": D4, "type": "integer", "const": 2}, 2.0, False),
    ({"$schema": D4, "type": ["integer", "string"], "enum": [3, "a"]}, 3.0, False),
    ({"$schema": D4, "type": "integer"}, 1.0, False),
    # the regex dialect under negation: '.' matches \r for Python, '$' matches before a final \n
    ({"not": {"pattern": "."}}, "\r", False),
    ({"not": {"pattern": "."}}, "\u2028", False),
    ({"not": {"pattern": "."}}, "\n", True),
    ({"not": {"pattern": "."}}, "", True),
    ({"not": {"pattern": "^a$"}}, "a\n", False),
    ({"not": {"pattern": "^a$"}}, "ab", True),
    ({"type": "string", "pattern": "^a$"}, "a\n", False, "ecma"),
    ({"not": {"pattern": "^\\d$"}}, "\u0663", False),       # ARABIC-INDIC DIGIT THREE: Python \d
    ({"type": "string", "pattern": "^\\d$"}, "\u0663", False, "ecma"),
    ({"type": "string", "pattern": "^[^\\d]$"}, "\u0663", False),
    ({"type": "string", "pattern": "^[^\\d]$"}, "x", True),
    ({"not": {"pattern": "^[^\\d]$"}}, "\u0663", False, "ecma"),
    ({"not": {"pattern": "^\\s$"}}, "\ufeff", False, "ecma"),  # ECMA \s only
    ({"not": {"pattern": "^\\s$"}}, "\x1c", False),         # Python \s only
    ({"not": {"pattern": "^\\w$"}}, "\u00e9", False),       # Python \w only
    ({"type": "object", "patternProperties": {".": False}}, {"\r": 1}, False),
    ({"type": "object", "patternProperties": {".": False}}, {"\n": 1}, True),
    ({"type": "object", "patternProperties": {"^a$": {"type": "integer"}}}, {"a\n": "x"}, False),
    ({"type": "object", "patternProperties": {"^a$": {"type": "integer"}}}, {"a": 1}, True),
    ({"type": "object", "patternProperties": {"^a$": {"type": "integer"}}}, {"b": "x"}, True),
    ({"type": "object", "properties": {"\r": {}}, "patternProperties": {".": False}}, {"\r": 1}, False),
    # a top-level branch that is one group holds its own anchors: (^a$)|(^b$) is ^a$|^b$
    ({"type": "string", "pattern": "(^$)|(^[a-f0-9]{2}-[a-f]$)"}, "", True),
    ({"type": "string", "pattern": "(^$)|(^[a-f0-9]{2}-[a-f]$)"}, "ab-c", True),
    ({"type": "string", "pattern": "(^$)|(^[a-f0-9]{2}-[a-f]$)"}, "xab-c", False),
    ({"type": "string", "pattern": "^$|(^(?:[a-z]+ ){0,2}[a-z]+$)"}, "a b c", True),
    ({"type": "string", "pattern": "^$|(^(?:[a-z]+ ){0,2}[a-z]+$)"}, "a b c d", False),
    ({"type": "string", "pattern": "(?:^a|b$)"}, "xa", False),
    ({"type": "string", "pattern": "(?:^a|b$)"}, "xb", True),
    ({"not": {"pattern": "(^a$)|(^b$)"}}, "b", False),
    ({"not": {"pattern": "(^a$)|(^b$)"}}, "ab", True),
    # anchors inside a pattern are assertions on the position ('$': ECMA's end of input, and
    # Python's before a final newline too)
    ({"type": "string", "pattern": "^([^,]|$)"}, "", True),
    ({"type": "string", "pattern": "^([^,]|$)"}, "a,", True),
    ({"type": "string", "pattern": "^([^,]|$)"}, ",a", False),
    ({"type": "string", "pattern": "^(a|$)"}, "\n", False, "ecma"),
    ({"not": {"pattern": "^(a|$)"}}, "\n", False),
    ({"not": {"pattern": "^(a|$)"}}, "b", True),
    ({"not": {"pattern": "(^|,)x"}}, ",x", False),
    ({"not": {"pattern": "(^|,)x"}}, "ax", True),
    ({"type": "string", "pattern": "^(\\/?([a-z]*)($|\\/))*$"}, "ab/cd", True),
    ({"type": "string", "pattern": "^(\\/?([a-z]*)($|\\/))*$"}, "ab/c.d", False),
    ({"oneOf": [{"type": "string", "pattern": "^(a|$)"}, {"type": "string", "maxLength": 1}]}, "a", False),
    ({"oneOf": [{"type": "string", "pattern": "^(a|$)"}, {"type": "string", "maxLength": 1}]}, "ab", True),
    ({"oneOf": [{"type": "string", "pattern": "^(a|$)"}, {"type": "string", "maxLength": 1}]}, "\n", False),
    # internal keywords of the compiler are unknown keywords (annotations) in a user schema
    ({"__not_strings": ["a"]}, "a", True),
    ({"__not_pattern": "a"}, "a", True),
    ({"__not_format": "date"}, "2024-01-01", True),
    ({"__ptr": 5}, 1, True),
    ({"__ptr": "#/definitions/x", "definitions": {"x": False}}, 1, True),
    ({"type": "string", "__not_strings": ["a"], "not": {"const": "b"}}, "a", True),
    ({"type": "string", "__not_strings": ["a"], "not": {"const": "b"}}, "b", False),
    # huge counts: maxima beyond the int32 capacity are read as the capacity, minima make the
    # type impossible (refused, never accepted)
    ({"type": "string", "maxLength": 2 ** 31}, "abc", True),
    ({"type": "string", "maxLength": 2 ** 64}, "abc", True),
    ({"type": "string", "minLength": 2 ** 31}, "abc", False),
    ({"type": ["string", "null"], "minLength": 2 ** 40}, None, True),
    ({"type": "array", "maxItems": 2 ** 31}, [1, 2], True),
    ({"type": "array", "minItems": 2 ** 31}, [], False),
    ({"type": "object", "maxProperties": 2 ** 40}, {"a": 1}, True),
    ({"type": "object", "minProperties": 2 ** 31}, {}, False),
    ({"not": {"type": "string", "minLength": 2 ** 31}}, "abc", True),
    ({"not": {"type": "string", "maxLength": 2 ** 31}}, "abc", False),
    # a format the schema's draft does not define is an annotation there by the letter of
    # the draft (fuzz finding, seed 7: draft-04 has no "date"); the grammar still enforces
    # it where asked (stricter: nothing invalid either way), but its `not` holds nothing
    ({"$schema": D4, "not": {"format": "date"}}, "12:00:00Z", False),
    ({"$schema": D4, "not": {"format": "date"}}, "2024-02-29", False),
    ({"$schema": "http://json-schema.org/draft-06/schema#", "not": {"format": "time"}}, "noon", False),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "not": {"format": "uuid"}}, "x", False),
    ({"not": {"format": "uuid"}}, "x", True),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "format": "date"}, "yesterday", False),
    # draft 3 calls ipv4 "ip-address"
    ({"$schema": "http://json-schema.org/draft-03/schema#", "format": "ip-address"}, "1.2.3.4", True),
    ({"$schema": "http://json-schema.org/draft-03/schema#", "format": "ip-address"}, "1.2.3", False),
    # if/then/else are draft 7 on: an annotation in a draft-04 schema (fuzz finding, seed 7)
    ({"$schema": D4, "if": {"type": "null"}, "else": {"const": 1}}, 2, True),
    ({"if": {"type": "null"}, "else": {"const": 1}}, 2, False),
    # const is draft 6 on: an annotation in an older draft (fuzz findings, seeds 7 and 13)
    ({"$schema": D4, "not": {"const": 3}}, 4, False),
    ({"$schema": D4, "const": 3}, 4, True),
    ({"$schema": D4, "oneOf": [{"type": "string"}, {"const": 1.5}]}, "1.2.3.4", False),
    ({"$schema": D4, "propertyNames": {"maxLength": 1}}, {"long": 1}, True),
    ({"propertyNames": {"maxLength": 1}}, {"long": 1}, False),
    # the `not` filter of an enum reads a number in every spelling (fuzz finding, seed 7)
    ({"if": {"not": {"type": "integer"}}, "then": {"enum": ["a", 1.0]}, "else": {"const": " "}}, 1, False),
    ({"if": {"not": {"type": "integer"}}, "then": {"enum": ["a", 1.0]}, "else": {"const": " "}}, "a", True),
    # -0 is 0
    ({"enum": [0]}, -0.0, True),
    ({"const": 0.0, "type": "integer"}, 0, True),
    # oneOf with an alternative given twice: a value it matches matches twice
    ({"oneOf": [{}, {"type": "string", "pattern": "^\\S?[0-9]+\\S"}, {}]}, "01.2.3.4", False),
    ({"oneOf": [{}, {"type": "string"}, {}]}, 5, False),
    # ... and positively it is enforced, stricter than the annotation (jsonschema accepts)
    ({"$schema": D4, "format": "date"}, "yesterday", False, "strict"),
    # from draft 6 on 1.0 is an integer: where a oneOf counts an integer alternative, integer
    # reads every integral spelling (fuzz finding, seed 7: oneOf [integer, number] took 1.0)
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.0, False),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1, False),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.5, True),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, -0.0, False),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1e100, False),
    ({"oneOf": [{"type": "integer", "minimum": 3, "multipleOf": 2}, {"type": "number", "maximum": 5}]}, 4.0, False),
    ({"oneOf": [{"type": "integer", "minimum": 3, "multipleOf": 2}, {"type": "number", "maximum": 5}]}, 6.0, True),
    # ... and the common oneOf of objects with integer properties stays compiled and exact
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "string"}}}]}, {"a": 1.0}, False),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "string"}}}]}, {"a": 1.5}, True),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}]}, {"a": 1}, True),
    # oneOf alternatives of one type that no value can satisfy together (a required
    # discriminator property, patterns read by either engine) may be approximate: at most one
    # of them can hold a value
    ({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "u": {"format": "email"}}, "required": ["kind"]},
                {"type": "object", "properties": {"kind": {"const": "b"}, "u": {"type": "string"}}, "required": ["kind"]}]},
     {"kind": "a", "u": "a@b.co"}, True),
    ({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "u": {"format": "email"}}, "required": ["kind"]},
                {"type": "object", "properties": {"kind": {"const": "b"}, "u": {"type": "string"}}, "required": ["kind"]}]},
     {"kind": "b", "u": "x"}, True),
    ({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "u": {"format": "email"}}, "required": ["kind"]},
                {"type": "object", "properties": {"kind": {"const": "b"}, "u": {"type": "string"}}, "required": ["kind"]}]},
     {"kind": "c"}, False),
    ({"oneOf": [{"type": "object", "properties": {"u": {"format": "email"}}, "required": ["u"], "additionalProperties": False},
                {"type": "object", "properties": {"v": {}}, "required": ["v"], "additionalProperties": False}]},
     {"u": "a@b.co"}, True),
    ({"oneOf": [{"type": "string", "pattern": "^https?://.+$"}, {"type": "string", "pattern": "^\\./.+$"}]}, "http://x", True),
    ({"oneOf": [{"type": "string", "pattern": "^https?://.+$"}, {"type": "string", "pattern": "^\\./.+$"}]}, "./a", True),
    ({"oneOf": [{"type": "string", "pattern": "^https?://.+$"}, {"type": "string", "pattern": "^\\./.+$"}]}, "x", False),
    ({"oneOf": [{"type": "string", "format": "email", "maxLength": 5}, {"type": "string", "minLength": 6}]}, "a@b.c", True),
    ({"oneOf": [{"type": "array", "prefixItems": [{"const": 1}, {"format": "email"}], "minItems": 1},
                {"type": "array", "prefixItems": [{"const": 2}]}]}, [1, "a@b.co"], True),
    ({"oneOf": [{"type": "array", "prefixItems": [{"const": 1}, {"format": "email"}], "minItems": 1},
                {"type": "array", "prefixItems": [{"const": 2}]}]}, [], True),
    # an approximation in the conjuncts every alternative shares (a narrowed format beside the
    # oneOf) narrows every alternative alike: "exactly one" stays exact on what it accepts
    ({"type": "object", "properties": {"u": {"type": "string", "format": "email"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1}, True),
    ({"type": "object", "properties": {"u": {"type": "string", "format": "email"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1, "b": 2}, False),
    ({"type": "object", "properties": {"u": {"type": "string", "format": "email"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1, "u": "x@y"}, True),
    ({"type": "object", "properties": {"u": {"type": "string", "format": "email"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"b": 1, "u": "\"a b\"@c.d"}, False, "strict"),
    ({"type": "object", "properties": {"u": {"type": "string", "format": "email"}},
      "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1, "b": 1, "u": "\"a b\"@c.d"}, False),
    ({"allOf": [{"properties": {"p": {"type": "string", "pattern": "^.$"}}}],
      "oneOf": [{"required": ["p"]}, {"properties": {"q": {"type": "integer"}}, "required": ["q"]}]}, {"p": "x"}, True),
    ({"allOf": [{"properties": {"p": {"type": "string", "pattern": "^.$"}}}],
      "oneOf": [{"required": ["p"]}, {"properties": {"q": {"type": "integer"}}, "required": ["q"]}]},
     {"p": "x", "q": 1}, False),
    # ... while a value the approximate program certainly judges stays exact
    ({"oneOf": [{"enum": ["a", "b\n"], "pattern": "^a$"}, {"type": "integer"}]}, "a", True),
    ({"oneOf": [{"enum": ["a\n", "b"], "not": {"pattern": "^b$"}}, {"type": "string"}]}, "a\n", False),
    # draft 4: only integer syntax is an integer, so number alone holds 1.0
    ({"$schema": D4, "oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.0, True),
    # a $ref/anyOf cycle that consumes nothing holds nothing (fuzz finding, seed 7: the
    # cycle's node was copied before it was filled, and `true` passed `type: array`)
    ({"allOf": [{"type": "array"}, {"$ref": "#/$defs/d"}], "$defs": {"d": {"anyOf": [{"$ref": "#/$defs/d"}]}}},
     True, False),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_exact_accept_or_refuse(case, backend):
    schema, value, accepted = case[:3]
    if case[3:] in (("ecma",), ("strict",)):
        assert not accepted and oracle(schema, value)
    else:
        assert oracle(schema, value) == accepted, "expectation disagrees with jsonschema"
    assert compile_schema(schema, backend).accepts(text(value)) == accepted


def test_integer_spellings_inside_a_counted_oneof():
    """Inside a oneOf that counts an integer alternative every integral spelling is that
    integer (1.0, 1e0, 10e-1, -0.0 ...), whatever JSON text holds it; outside, integer
    keeps integer syntax only (refusing is safe, and tool arguments stay integers)."""
    s = {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 100}]}
    for backend in BACKENDS:
        g = compile_schema(s, backend)
        for t in ("1", "1.0", "1e0", "10e-1", "-0.0", "0.5e1", "150.5"):
            assert g.accepts(t), t
        for t in ("1.5", "1e-1", "100.0", "1e2", "150"):
            assert not g.accepts(t), t
        # types apart: no other alternative can hold a number, integer syntax stays
        apart = compile_schema({"oneOf": [{"type": "integer"}, {"type": "string"}]}, backend)
        assert apart.accepts("1") and not apart.accepts("1.0")
        mixed = compile_schema({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]}, backend)
        for t, ok in (("1", True), ("1.0", True), ("1.5", False), ("2", False), ("2.0", False),
                      ("20e-1", False), ("2.5", True), ("25e-1", True)):
            assert mixed.accepts(t) == ok, t
        plain = compile_schema({"type": "integer"}, backend)
        assert plain.accepts("1") and not plain.accepts("1.0")
        # alternatives that a required property keeps apart: at most one can hold a value,
        # integer syntax stays (an integer argument stays an integer)
        tagged = compile_schema({"oneOf": [
            {"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "integer"}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": "b"}, "n": {"type": "number"}}, "required": ["k"]}]},
            backend)
        assert tagged.accepts('{"k":"a","n":1}') and not tagged.accepts('{"k":"a","n":1.0}')
        assert tagged.accepts('{"k":"b","n":1.0}')


def test_cycles_without_progress_are_the_least_fixed_point():
    """d = anyOf[d, X] holds what X holds (a validator that recurses on d never ends, so
    jsonschema cannot judge these: RecursionError); recursion through items stays."""
    d = {"$defs": {"d": {"anyOf": [{"$ref": "#/$defs/d"}, {"type": "null"}]}}, "$ref": "#/$defs/d"}
    g = compile_schema(d)
    assert g.accepts("null") and not g.accepts("1") and not g.accepts("[]")
    alone = {"$defs": {"d": {"anyOf": [{"$ref": "#/$defs/d"}]}}, "$ref": "#/$defs/d"}
    assert not any(compile_schema(alone).accepts(x) for x in ("true", "null", "[]", "{}", '"a"'))
    tree = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
    assert compile_schema(tree).accepts("[1,[2,[3]],[]]") and not compile_schema(tree).accepts('[1,"x"]')
    kids = {"type": "object", "properties": {"kids": {"type": "array", "items": {"anyOf": [{"$ref": "#"}]}}}}
    assert compile_schema(kids).accepts('{"kids":[{"kids":[]}]}') and not compile_schema(kids).accepts('{"kids":[1]}')


REFUSED = [
    # an alternative stricter than its draft's letter (a format/const it leaves an annotation)
    # beside one that can match the same value: "exactly one" cannot be exact
    ({"$schema": D4, "oneOf": [{"format": "date"}, {"type": "string"}]}, "oneOf"),
    # narrowed formats: their complement would accept valid values (leap seconds, quoted or
    # IP-literal emails); refused under not / if / overlapping oneOf
    ({"not": {"type": "string", "format": "email"}}, "not"),
    ({"not": {"format": "time"}}, "not"),
    ({"not": {"format": "date-time"}}, "not"),
    ({"not": {"format": "uri"}}, "not"),
    ({"if": {"format": "email"}, "then": {"maxLength": 3}}, "not"),
    ({"oneOf": [{"type": "string", "format": "email"}, {"type": "string", "pattern": "^a"}]}, "oneOf"),
    ({"oneOf": [{"type": "string", "format": "time"}, {"type": "string"}]}, "oneOf"),
    ({"oneOf": [{"properties": {"d": {"format": "email"}}}, {"type": "object"}]}, "oneOf"),
    # an enum value dropped only because the program judging it is approximate (a '$' read
    # as ECMA reads it, an approximate `not`) may be valid: beside an overlapping alternative
    # "exactly one" would let it through the other one (fuzz finding, seed 9020)
    ({"oneOf": [{"enum": ["a\n"], "pattern": "^a$"}, {"type": "string"}]}, "oneOf"),
    ({"oneOf": [{"enum": ["a\n", 5], "pattern": "^a$"}, {"type": "string"}]}, "oneOf"),
    ({"oneOf": [{"enum": ["x"], "not": {"type": "object", "patternProperties": {"a$": {}},
                                         "oneOf": [{"required": ["_"]}, {}]}}, {"type": "string"}]}, "oneOf"),
    ({"$schema": "http://json-schema.org/draft-06/schema#",
      "oneOf": [False, {"allOf": [{"type": "string"}, {"const": "\ufeff"},
                                  {"not": {"type": "object", "patternProperties": {"(?:a|b){1,3}xa$": {"type": "null"}},
                                           "oneOf": [{"required": ["_"]}, {"properties": {"k1": {}}}]}}]}, True]},
     "oneOf"),
    # ... also beside shared conjuncts that are approximate themselves: the alternative's own
    # narrowed email would let {"a": 1, "u": "\"a b\"@c.d"} (both match) through the first
    ({"type": "object", "properties": {"v": {"format": "email"}},
      "oneOf": [{"required": ["a"]}, {"properties": {"u": {"format": "email"}}}]}, "oneOf"),
    # ... but not when a value can satisfy both: an object without the discriminator
    ({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "u": {"format": "email"}}},
                {"type": "object", "properties": {"kind": {"const": "b"}}}]}, "oneOf"),
    ({"oneOf": [{"type": "array", "prefixItems": [{"const": 1}, {"format": "email"}]},
                {"type": "array", "prefixItems": [{"const": 2}]}]}, "oneOf"),
    ({"oneOf": [{"type": "string", "pattern": "^a.$"}, {"type": "string", "pattern": "^.b$"}]}, "oneOf"),
    # a required key the engines read differently leaves nothing only under the approximation:
    # {"\r": 1} matches both alternatives for Python, so it must not pass the second alone
    ({"oneOf": [{"type": "object", "patternProperties": {"^.$": {"type": "integer"}}, "required": ["\r"]},
                {"type": "object"}]}, "required"),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"^.$": {}},
                                                        "required": ["\r"]}}},
                {"type": "object"}]}, "required"),
    # a pattern the two regex engines read differently inside an overlapping oneOf
    ({"oneOf": [{"type": "string", "pattern": "^.$"}, {"type": "string"}]}, "oneOf"),
    # '$' together with a construct read differently ('.') still refuses the oneOf
    ({"oneOf": [{"type": "string", "pattern": "^a.$"}, {"type": "string", "maxLength": 2}]}, "oneOf"),
    # constructs the engines read differently and that cannot be made exact
    ({"type": "string", "pattern": "^x{,3}$"}, "pattern"),
    ({"type": "string", "pattern": "[]a]"}, "pattern"),
    ({"type": "string", "pattern": "[^]a]"}, "pattern"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,keyword", REFUSED, ids=[f"{i}" for i in range(len(REFUSED))])
def test_refused_with_a_named_error(schema, keyword, backend):
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_schema(schema, backend)
    assert info.value.keyword == keyword
    assert info.value.pointer and info.value.pointer.startswith("#")


# oneOf over patterns whose only dialect difference is '$' (Python also matches before a
# final newline): compiled, exact on every string that does not end in a newline, and a
# string value ending in a newline is refused inside the oneOf -- never accepted where
# jsonschema forbids it (two alternatives match under Python's reading)
DOLLAR_ONEOF = [
    {"oneOf": [{"type": "string", "pattern": "^a$"}, {"type": "string", "maxLength": 1}]},
    {"oneOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "string", "pattern": "^[0-9]+$"},
               {"type": "string", "pattern": "\n$"}]},
    {"oneOf": [{"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}},
                "required": ["id"]},
               {"type": "object", "properties": {"id": {"type": "string", "maxLength": 3}}}]},
    {"oneOf": [{"type": "array", "items": {"pattern": "^x$"}}, {"type": "array", "maxItems": 1}]},
]
DOLLAR_VALUES = ["a", "b", "", "ab", "abc", "123", "a1", "a\n", "\n", "abc\n", "12\n", "x\n\n",
                 {"id": "ab"}, {"id": "abcd"}, {"id": "a1"}, {"id": "ab\n"}, {"id": "abcd\n"},
                 {"id": "a\n"}, {}, {"other": "q\n"}, ["x"], ["x", "x"], ["x\n"], ["x\n", "x"], ["y", "x"], []]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema", DOLLAR_ONEOF, ids=[f"{i}" for i in range(len(DOLLAR_ONEOF))])
def test_oneof_with_dollar_patterns_is_exact(schema, backend):
    g = compile_schema(schema, backend)
    for v in DOLLAR_VALUES:
        accepted = g.accepts(text(v))
        if "\\n" in text(v):   # a string ending in (or holding) a newline
            assert not accepted or oracle(schema, v), f"accepted {v!r}, which jsonschema forbids"
        else:
            assert accepted == oracle(schema, v), v


def test_oneof_with_dollar_patterns_cases():
    s0, s1 = DOLLAR_ONEOF[0], DOLLAR_ONEOF[1]
    g0, g1 = compile_schema(s0), compile_schema(s1)
    assert g0.accepts(text("b")) and not g0.accepts(text("a")) and not g0.accepts(text("abc"))
    assert g1.accepts(text("abc")) and g1.accepts(text("123")) and not g1.accepts(text("a1"))
    # "abc\n": Python matches both ^[a-z]+$ and \n$ -- two alternatives, jsonschema forbids it
    assert not oracle(s1, "abc\n") and not g1.accepts(text("abc\n"))
    # "a\n": Python's ^a$ matches it and maxLength 1 does not -- jsonschema allows it; ECMA's
    # ^a$ does not match it, so the dialect refuses it (refusing is always safe)
    assert oracle(s0, "a\n") and not g0.accepts(text("a\n"))


def test_format_sets_are_documented():
    assert EXACT_FORMATS == {"date", "uuid", "ipv4", "json-pointer"}
    assert NARROWED_FORMATS == {"email", "time", "date-time", "uri", "hostname", "idn-hostname", "ipv6",
                                "idn-email", "uri-reference", "iri", "iri-reference", "uri-template",
                                "relative-json-pointer", "duration", "regex"}


# formats the grammar holds beside the first ones: what it accepts jsonschema's checker (where
# it checks the format) accepts too, what it refuses is refused by the format's rule
FORMAT_CASES = [
    ("hostname", "example.com", True), ("hostname", "localhost", True), ("hostname", "a-b.c0", True),
    ("hostname", "example.com:8080", False), ("hostname", "Invalid Hostname", False),
    ("hostname", "-a.com", False), ("hostname", "a..b", False), ("hostname", "a" * 64, False),
    ("hostname", ("a." * 126) + "ab", False),            # 254 characters
    ("idn-hostname", "example.com", True), ("idn-hostname", "ab--cd.com", False),
    ("ipv6", "::1", True), ("ipv6", "2001:db8::8a2e:370:7334", True), ("ipv6", "1:2:3:4:5:6:7:8", True),
    ("ipv6", "1::2::3", False), ("ipv6", "1:2:3:4:5:6:7:8:9", False), ("ipv6", "12345::", False),
    ("json-pointer", "", True), ("json-pointer", "/a~0b/c~1", True), ("json-pointer", "/a~2", False),
    ("json-pointer", "a", False),
    ("relative-json-pointer", "0#", True), ("relative-json-pointer", "1/a", True),
    ("relative-json-pointer", "01/a", False), ("relative-json-pointer", "#", False),
    ("regex", "^[a-zA-Z0-9_]{3,16}$", True), ("regex", "^(\\d+)(-\\d+)?$", True), ("regex", "*", False),
    ("regex", "\\", False), ("regex", "(a", False), ("regex", "a{3,1}", False), ("regex", "[z-a]", False),
    ("uri-reference", "https://example.com/a?b#c", True), ("uri-reference", "/etc/x", True),
    ("uri-reference", "#frag", True), ("uri-reference", "invalid Id", False),
    ("duration", "P1Y2M3DT4H5M6S", True), ("duration", "P1W", True), ("duration", "PT", False),
    ("duration", "P1H", False), ("uri-template", "http://x/{id}{?q,r*}", True), ("uri-template", "{", False),
]


@pytest.mark.parametrize("fmt,value,accepted", FORMAT_CASES)
def test_added_formats(fmt, value, accepted):
    schema = {"type": "string", "format": fmt}
    if accepted:
        assert oracle(schema, value)
    for backend in BACKENDS:
        assert compile_schema(schema, backend).accepts(text(value)) == accepted
    if fmt in EXACT_FORMATS:
        assert compile_schema({"not": schema}).accepts(text(value)) != accepted


def test_enum_under_narrowed_not_is_refused_conservatively():
    """{"enum": [...], "not": <narrowed format>} filters the enum statically: a value the
    narrowed format refuses may still be in the format, so it is dropped, never kept."""
    schema = {"enum": ["a@[1.2.3.4]", "plain"], "not": {"type": "string", "format": "email"}}
    g = compile_schema(schema)
    for v in ("a@[1.2.3.4]", "plain"):
        if g.accepts(text(v)):
            assert oracle(schema, v)
    assert not g.accepts(text("a@[1.2.3.4]"))


MALFORMED = [
    ({"required": [1]}, "required"),
    ({"required": ["a", 5]}, "required"),
    ({"required": "a"}, "required"),
    ({"dependentRequired": {"a": [1]}}, "dependentRequired"),
    ({"dependentRequired": {"a": "b"}}, "dependentRequired"),
    ({"dependentRequired": []}, "dependentRequired"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": [1]}}, "dependencies"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"a": 5}}, "dependencies"),
    ({"prefixItems": 5}, "prefixItems"),
    ({"items": 5}, "items"),
    ({"$schema": 5}, "$schema"),
    ({"$schema": ["x"]}, "$schema"),
    ({"format": []}, "format"),
    ({"format": 5}, "format"),
    ({"pattern": 5}, "pattern"),
    ({"not": {"pattern": 5}}, "pattern"),
    ({"properties": []}, "properties"),
    ({"patternProperties": 5}, "patternProperties"),
    ({"enum": 5}, "enum"),
    ({"anyOf": {}}, "anyOf"),
    ({"additionalProperties": 5}, "additionalProperties"),
    ({"propertyNames": "x"}, "propertyNames"),
    ({"not": 5}, "not"),
    ({"type": 5}, "type"),
    ({"type": ["string", 5]}, "type"),
    ({"$ref": 5}, "$ref"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,keyword", MALFORMED, ids=[f"{i}" for i in range(len(MALFORMED))])
def test_malformed_keyword_values_raise_schema_error(schema, keyword, backend):
    with pytest.raises(SchemaError) as info:
        compile_schema(schema, backend)
    assert keyword in str(info.value)
    assert isinstance(info.value, NeedleError)


def test_huge_counts_in_property_names_are_a_named_limit():
    with pytest.raises(GrammarLimitError, match="maxLength"):
        compile_schema({"propertyNames": {"maxLength": 2 ** 31}})


def test_tokenizer_decode_refuses_non_int_ids():
    """decode([True]) once decoded as id 1."""
    from pathlib import Path

    import numpy as np

    import needle_cy
    from needle_cy import Tokenizer, TokenizerError
    tok = Tokenizer.from_archive(Path(needle_cy.__file__).parent / "models" / "default.cact")
    assert tok.decode(np.array([5, 6])) == tok.decode([5, 6])
    for bad in ([True], [1, False], [1.0], [np.bool_(True)], [5, "a"], None):
        with pytest.raises(TokenizerError):
            tok.decode(bad)
    with pytest.raises(TokenizerError):
        tok.piece_bytes(True)
    with pytest.raises(TokenizerError):
        tok.stream_decoder().push(True)


def test_widened_class_unions_are_supersets():
    """\\d and \\w in "either" mode are widened (cheap automata); they must contain Python's."""
    from needle_cy.grammar.charset import _WIDE_FROM, _py_class, class_ranges
    for letter in "dw":
        wide = class_ranges(letter, "either")
        for lo, hi in _py_class(letter):
            assert any(a <= lo and hi <= b for a, b in wide), (letter, lo, hi)
        assert not [r for r in _py_class(letter) if r[1] >= 0x80 and r[0] < _WIDE_FROM[letter]]


# An enum/const number takes a few spellings of its values ("1.5", not "1.50" or "15e-1"):
# beside a oneOf alternative that takes every spelling, "exactly one" would let "1.50"
# through (both alternatives hold it).  Such a oneOf is refused unless the two are apart.
ENUM_NUMBER_ONEOFS_REFUSED = [
    {"oneOf": [{"enum": [1.5]}, {"type": "number"}]},
    {"oneOf": [{"const": 2}, {"type": "number"}]},
    {"oneOf": [{"enum": [1.5, 3]}, {"type": "number", "minimum": 2}]},
    {"oneOf": [{"type": "array", "items": {"enum": [1.5]}}, {"type": "array"}]},
    # once accept/refuse cases, each with a spelling that got through: "0.00" (enum 0
    # refused it, true took it) and "2e0" (the integer enum refused it, number took it)
    {"oneOf": [{"enum": [0, "}"], "type": "number"}, True]},
    {"oneOf": [{"type": "integer", "enum": [1, 2]}, {"type": "number"}]},
]


@pytest.mark.parametrize("schema", ENUM_NUMBER_ONEOFS_REFUSED,
                         ids=[str(i) for i in range(len(ENUM_NUMBER_ONEOFS_REFUSED))])
def test_enum_number_beside_an_overlapping_number_alternative_is_refused(schema):
    for backend in ("cython", "python"):
        with pytest.raises(UnsupportedSchemaError, match="oneOf"):
            compile_schema(schema, backend=backend)


@pytest.mark.parametrize("schema,accepted,refused", [
    ({"oneOf": [{"enum": [1.5]}, {"type": "number", "minimum": 2}]}, ["1.5", "2", "3.25"], ["1.50", "1"]),
    ({"oneOf": [{"enum": [4]}, {"type": "integer", "multipleOf": 3}]}, ["4", "6"], ["5", "12.5"]),
    ({"oneOf": [{"enum": [1.5]}, {"enum": [2, 3]}]}, ["1.5", "2", "3.0"], ["1.50", "4"]),
    ({"oneOf": [{"enum": [1.5, "a"]}, {"type": "string"}]}, ["1.5", '"b"'], ['"a"', "2"]),
])
def test_enum_number_oneofs_kept_apart_compile_exactly(schema, accepted, refused):
    validator = jsonschema.Draft202012Validator(schema)
    for backend in ("cython", "python"):
        g = compile_schema(schema, backend=backend)
        for text in accepted:
            assert validator.is_valid(json.loads(text)), text
            st = g.start()
            assert st.feed(text.encode()) and st.is_complete(), (backend, text)
        for text in refused:
            st = g.start()
            assert not (st.feed(text.encode()) and st.is_complete()), (backend, text)


# Every draft reads a user schema in its own vocabulary (a keyword the draft does not define
# is an annotation there), while the compiler's synthetic schemas -- an exact enum/const
# value among them -- read the same in every draft.  Fuzz finding, seed 777: with the
# draft-04 $schema an enum holding an object took any object with the same keys, because the
# value's synthetic schema was `const` per member (an annotation in draft 4).  Each shape is
# run in every draft whose meta-schema accepts it, against jsonschema, on both runtimes.
DRAFTS = {3: "http://json-schema.org/draft-03/schema#", 4: D4, 6: "http://json-schema.org/draft-06/schema#",
          7: "http://json-schema.org/draft-07/schema#", 2019: "https://json-schema.org/draft/2019-09/schema",
          2020: "https://json-schema.org/draft/2020-12/schema"}
# (schema, values, must_compile): a schema that does not have to compile may raise
# UnsupportedSchemaError naming one of its keywords (never accept what the draft forbids)
DRAFT_SHAPES = [
    ({"enum": [{"a": 1}]}, [{"a": 1}, {"a": 2}, {"a": False}, {}, {"a": 1, "b": 2}, [1]], True),
    ({"type": "object", "properties": {"p": {"enum": [{"a": 1}]}}},
     [{"p": {"a": 1}}, {"p": {"a": 2}}, {"p": {}}, {}], True),
    ({"enum": ["\n", {"a": 1}, "foo", "\"a b\"@c.d"]}, [{"a": False}, {"a": 1}, "foo", "\n", "x"], True),
    ({"enum": [[1, "a"], {"a": [1]}]}, [[1, "a"], [1, "b"], [1], [], {"a": [1]}, {"a": [2]}], True),
    ({"enum": [[{"a": [1, {"b": None}]}]]}, [[{"a": [1, {"b": None}]}], [{"a": [1, {"b": 0}]}], [{"a": [1]}]], True),
    ({"type": "array", "items": {"enum": [[1], {"k": "v"}]}}, [[[1], {"k": "v"}], [[2]], [{"k": "w"}]], True),
    ({"const": {"a": 1}}, [{"a": 1}, {"a": 2}, 5], True),
    ({"const": [1]}, [[1], [2], [], 1], True),
    ({"const": 3}, [3, 4, 3.0], True),
    ({"not": {"const": 3}}, [3, 4], True),
    ({"not": {"enum": [1, 2]}}, [1, 1.5, 2, 3, "a"], True),
    ({"allOf": [{"enum": [{"a": 1}, {"a": 2}]}, {"properties": {"a": {"maximum": 1}}}]},
     [{"a": 1}, {"a": 2}, {"a": 0}], True),
    ({"oneOf": [{"const": [1]}, {"type": "array"}]}, [[1], [2], 1], False),
    ({"oneOf": [{"enum": [{"a": 1}]}, {"type": "object"}]}, [{"a": 1}, {"a": 2}, 1], False),
    ({"oneOf": [{"dependentRequired": {"a": ["b"]}}, {"type": "object"}]}, [{"a": 1}, {"a": 1, "b": 2}, 1], False),
    ({"oneOf": [{"dependentSchemas": {"a": False}}, {"type": "object"}]}, [{"a": 1}, {}, 1], False),
    ({"oneOf": [{"dependencies": {"a": ["b"]}}, {"type": "object"}]}, [{"a": 1}, {"a": 1, "b": 2}, 1], False),
    ({"dependencies": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}, {}], True),
    ({"dependentRequired": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}, {}], True),
    ({"oneOf": [{"prefixItems": [{"type": "string"}]}, {"type": "array"}]}, [[1], ["a"], 1], False),
    ({"oneOf": [{"propertyNames": {"maxLength": 1}}, {"type": "object"}]}, [{"ab": 1}, {"a": 1}, 1], False),
    ({"not": {"propertyNames": {"maxLength": 1}}}, [{"ab": 1}, {"a": 1}, 1], False),
    ({"oneOf": [{"if": {"type": "string"}, "then": {"maxLength": 1}}, {"type": "string"}]}, ["ab", "a", 1], False),
    ({"oneOf": [{"anyOf": [{"type": "string"}]}, {"type": "number"}]}, ["a", 1, None], True),
    ({"oneOf": [{"minProperties": 2}, {"type": "object"}]}, [{"a": 1}, {"a": 1, "b": 2}, 1], True),
    ({"type": "object", "required": ["a"]}, [{}, {"a": 1}], True),
    ({"contains": {"type": "string"}}, [[1], ["a"], 1], False),
    ({"unevaluatedProperties": False, "properties": {"a": {}}}, [{"a": 1}, {"b": 1}], False),
    ({"type": "number", "maximum": 3, "exclusiveMaximum": True}, [3, 2.5, 4], True),
    ({"not": {"maximum": 3, "exclusiveMaximum": True}}, [3, 2.5, "a"], True),
    ({"not": {"exclusiveMaximum": 3}}, [3, 2.5, "a"], True),
    ({"type": "integer", "enum": [1, 2.0]}, [1, 2, 3, 2.5, "1"], True),
]


def _draft_cases():
    out = []
    for i, (schema, values, must) in enumerate(DRAFT_SHAPES):
        for d, uri in DRAFTS.items():
            doc = dict(schema, **{"$schema": uri})
            cls = jsonschema.validators.validator_for(doc)
            try:
                cls.check_schema(doc)
            except jsonschema.SchemaError:
                continue      # not a schema of that draft
            out.append(pytest.param(doc, values, must, id=f"{i}-{d}"))
    return out


def _keywords_of(node):
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keywords_of(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keywords_of(v)}
    return set()


@pytest.mark.parametrize("schema,values,must_compile", _draft_cases())
def test_every_draft_reads_its_own_vocabulary(schema, values, must_compile):
    for backend in BACKENDS:
        try:
            g = compile_schema(schema, backend)
        except UnsupportedSchemaError as exc:
            assert not must_compile, f"refused: {exc}"
            assert exc.keyword in _keywords_of(schema) and exc.pointer.startswith("#")
            continue
        for v in values:
            assert g.accepts(text(v)) == oracle(schema, v), (backend, v)


def test_draft_shapes_cover_every_draft():
    """The shapes above run in every draft (a shape list that no draft accepts tests nothing)."""
    drafts = {p.id.split("-")[1] for p in _draft_cases()}
    assert drafts == {str(d) for d in DRAFTS}
    assert len(_draft_cases()) > 5 * len(DRAFTS)


D3 = DRAFTS[3]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,value,accepted", [
    # draft 3's required is a boolean in the property's schema, its dependencies may name one
    # property as a string; allOf/anyOf/oneOf/not/minProperties are draft 4 on
    ({"$schema": D3, "properties": {"a": {"required": True}}}, {}, False),
    ({"$schema": D3, "properties": {"a": {"required": True}}}, {"a": 1}, True),
    ({"$schema": D3, "properties": {"a": {"required": False}}}, {}, True),
    ({"$schema": D3, "properties": {"a": {"$ref": "#/definitions/x", "required": True}},
      "definitions": {"x": {"type": "string"}}}, {}, False),
    ({"$schema": D3, "dependencies": {"a": "b"}}, {"a": 1}, False),
    ({"$schema": D3, "dependencies": {"a": "b"}}, {"a": 1, "b": 2}, True),
    ({"$schema": D3, "anyOf": [{"type": "string"}]}, 1, True),
    ({"$schema": D3, "not": {}}, 1, True),
    ({"$schema": D3, "type": "object", "required": ["a"]}, {}, True),
    ({"$schema": D3, "type": "any", "enum": [{"a": 1}]}, {"a": 2}, False),
    # jsonschema reads any true `required` there (a list is no draft-3 form; requiring is
    # the stricter reading), fuzz finding, seed 9504
    ({"$schema": D3, "properties": {"a": {"required": ["x"]}}}, {}, False),
    # draft 3's time is hh:mm:ss (strptime "%H:%M:%S"), not RFC 3339's (fuzz finding, seed 9501)
    ({"$schema": D3, "type": "string", "format": "time"}, "12:00:00Z", False),
    ({"$schema": D3, "type": "string", "format": "time"}, "12:00:00", True),
    ({"$schema": D3, "type": "string", "format": "time"}, "1:2:3", True),
    ({"$schema": D3, "type": "string", "format": "time"}, "23:59:60", False),
    ({"$schema": D3, "type": "string", "format": "time"}, "24:00:00", False),
    ({"$schema": D3, "type": "string", "format": "time"}, "12:00:00 ", False),
])
def test_draft3_forms(schema, value, accepted, backend):
    assert oracle(schema, value) == accepted, "expectation disagrees with jsonschema"
    assert compile_schema(schema, backend).accepts(text(value)) == accepted


def test_draft3_time_is_strptime():
    """Draft 3's time format against the checker jsonschema runs, on every short spelling:
    exact on ASCII digits, and a Unicode digit strptime takes is refused (narrowed)."""
    import itertools
    from datetime import datetime
    g = compile_schema({"$schema": D3, "type": "string", "format": "time"})
    digits = [str(i) for i in range(10)] + ["00", "09", "23", "24", "59", "60", "61", "7a", "\u0661"]
    for h, m, sec in itertools.product(["0", "1", "09", "19", "23", "24", "123"], digits, ["0", "5", "59", "60", "05"]):
        value = f"{h}:{m}:{sec}"
        try:
            valid = bool(datetime.strptime(value, "%H:%M:%S"))
        except ValueError:
            valid = False
        assert g.accepts(text(value)) == (valid and value.isascii()), value



# contains: each item is counted through a marking alternative (items and contains); without
# maxContains some thread counts every match, with it the complement makes the count exact
CONTAINS = [
    {"contains": {"type": "integer"}},
    {"type": "array", "contains": {"const": "a"}, "minContains": 2},
    {"contains": {"type": "string"}, "maxContains": 1},
    {"contains": {"type": "string"}, "minContains": 0, "maxContains": 1},
    {"contains": {"enum": [2, "b"]}, "minContains": 2, "maxContains": 2},
    {"prefixItems": [{"type": "string"}], "items": {"type": ["integer", "string"]},
     "contains": {"type": "string"}, "minContains": 2},
    {"not": {"contains": {"type": "string"}}},
    {"not": {"contains": {"enum": [1, "a"]}, "maxContains": 1}},
    {"oneOf": [{"contains": {"type": "integer"}}, {"contains": {"type": "string"}}]},
    {"items": {"contains": {"type": "integer"}}, "contains": {"type": "array"}},
    {"contains": {"type": "integer"}, "uniqueItems": True, "maxItems": 2},
    {"contains": False},
    {"contains": True, "minContains": 3},
    {"$schema": "http://json-schema.org/draft-07/schema#", "contains": {"type": "string"}, "minContains": 3},
]


@pytest.mark.parametrize("schema", CONTAINS, ids=[str(i) for i in range(len(CONTAINS))])
def test_contains_counts_exactly(schema):
    import itertools
    vals = [1, 2, "a", "b", None, [1]]
    arrays = [[]] + [list(p) for n in range(1, 4) for p in itertools.product(vals, repeat=n)] + [1, "a", {}]
    graded = {True: 0, False: 0}
    for backend in BACKENDS:
        g = compile_schema(schema, backend)
        for a in arrays:
            want = oracle(schema, a)
            assert g.accepts(text(a)) == want, (backend, a)
            graded[want] += 1
    assert graded[True] and graded[False]      # both answers occur


def test_contains_refusals_are_named():
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_schema({"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}}]})
    assert info.value.keyword == "contains"
    with pytest.raises(UnsupportedSchemaError) as info:
        compile_schema({"contains": {"type": "string", "format": "email"}, "maxContains": 1})
    assert info.value.keyword == "maxContains" and info.value.pointer == "#/maxContains"
