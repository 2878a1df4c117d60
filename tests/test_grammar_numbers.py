"""Numbers: a number byte is refused exactly when no completion remains.

After every byte the number prefix must be alive iff some completion (more bytes,
then a delimiter) is a JSON number that meets every constraint of the node
(minimum/maximum, exclusive forms, multipleOf; "type": "integer" admits no '.'/'e'
by design) and fits the number buffer (NUM_BUF bytes).  Both engines are compared
with an independent oracle that works on exact fractions, and complete numbers
with ``jsonschema`` on exact values.
"""
import itertools
import math
import random
from fractions import Fraction

import jsonschema
import pytest

from needle_cy.grammar import NUM_BUF, compile_schema

import os
BACKENDS = os.environ.get("NUM_BACKENDS", "cython,python").split(",")
MANT = "0123456789"


# ----------------------------------------------------------------------------- the oracle

def frac(text):
    return Fraction(text)  # Fraction parses JSON number text (with exponent) exactly


def value_ok(c, v):
    """Does the exact value v satisfy constraint dict c (lo, lo_x, hi, hi_x, mult as Fractions)?"""
    if c["lo"] is not None and (v < c["lo"] or (c["lo_x"] and v == c["lo"])):
        return False
    if c["hi"] is not None and (v > c["hi"] or (c["hi_x"] and v == c["hi"])):
        return False
    if c["mult"] is not None and (v / c["mult"]).denominator != 1:
        return False
    return True


def mirrored(c):
    """Constraints on -v for negative v."""
    return {"lo": None if c["hi"] is None else -c["hi"], "lo_x": c["hi_x"],
            "hi": None if c["lo"] is None else -c["lo"], "hi_x": c["lo_x"], "mult": c["mult"]}


def n_window(c, s):
    """For values N*10**s: (smallest N allowed by lo, largest by hi, step N must be a multiple of)."""
    scale = Fraction(10) ** s
    lo_n, hi_n = None, None
    if c["lo"] is not None:
        b = c["lo"] / scale
        lo_n = math.floor(b) + 1 if (c["lo_x"] and b.denominator == 1) else math.ceil(b)
    if c["hi"] is not None:
        b = c["hi"] / scale
        hi_n = math.ceil(b) - 1 if (c["hi_x"] and b.denominator == 1) else math.floor(b)
    step = 1 if c["mult"] is None else (scale / c["mult"]).denominator   # N*scale/mult integral
    return lo_n, hi_n, step


def some_n(win, lo_n, hi_n):
    """Is some integer N in [lo_n, hi_n] inside the window (see n_window)?"""
    wl, wh, step = win
    if wl is not None:
        lo_n = max(lo_n, wl)
    if wh is not None:
        hi_n = min(hi_n, wh)
    if lo_n > hi_n:
        return False
    return -(-lo_n // step) * step <= hi_n


K_DIGITS = 5      # appended mantissa digits tried by the oracle
E_RANGE = 14      # exponents tried: -E_RANGE .. E_RANGE


def oracle_live(c, text, integer):
    """Liveness by exhaustion of completion *shapes* over exact fractions.

    A completion appends i integer digits, optionally '.' and f fraction digits,
    optionally an exponent X: its values are N*10**s with N in an integer interval
    (a = i + f digits appended) and s = X - (fraction digits), so one exact interval
    test per (a, s) decides every shape with those two numbers.  For the pools below
    (bounds and multiples with at most 3 significant digits, magnitudes 10**-2..10**3)
    every live prefix of at most 7 bytes has a witness with at most 4 appended digits and
    |X| <= 12 (10**4 consecutive N hold a multiple of any mu <= 999 and pass any 3-digit
    bound), so K_DIGITS/E_RANGE make the search exhaustive; lengths stay far below NUM_BUF.
    """
    if not text:
        return True
    if text == "-":
        return any(oracle_live(c, text + d, integer) for d in MANT)
    neg = text.startswith("-")
    if neg:
        c = mirrored(c)
    body = text[1:] if neg else text
    if "e" in body:
        i = body.find("e")
        mant, ex = body[:i], body[i + 1:]
        m = frac(mant)
        sign_typed = ex[:1] in ("+", "-")
        digits = ex[1:] if sign_typed else ex
        # the grammar writes no magnitude of 1e308 or more (no double holds it), and more
        # exponent digits only grow a positive exponent
        if ex[:1] != "-" and digits and abs(m) * Fraction(10) ** int(digits) >= 10 ** 308:
            return False
        xs = set()
        for extra in range(0, 4):   # values of the exponent after 0..3 more digits, clipped
            if not digits and not extra:
                continue
            g = int(digits) if digits else 0
            lo_x, hi_x = g * 10 ** extra, (g + 1) * 10 ** extra - 1
            # past |x| = 40 nothing changes for the pools below (beyond every bound, and a
            # multiple from then on or never), so larger exponents are represented by 41
            xs.update(range(min(lo_x, 41), min(hi_x, 41) + 1))
        signs = [-1 if ex[:1] == "-" else 1] if (sign_typed or digits) else [1, -1]
        return any(value_ok(c, m * Fraction(10) ** (sg * x)) for x in xs for sg in signs)
    if "." in body:
        ip, fp = body.split(".")
    else:
        ip, fp = body, None
    pairs = set()   # (a, s)
    exps = [0] if integer else range(-E_RANGE, E_RANGE + 1)
    f0 = len(fp) if fp else 0
    if fp is None:
        for i in range(K_DIGITS + 1 if ip != "0" else 1):
            for x in exps:
                pairs.add((i, x))
                if not integer:
                    for f in range(1, K_DIGITS + 1 - i):
                        pairs.add((i + f, x - f))
    else:
        for f in range(0 if fp else 1, K_DIGITS + 1):
            for x in exps:
                pairs.add((f, x - f0 - f))
    p = int(ip + (fp or ""))
    wins = {}
    for a, s in pairs:
        if s not in wins:
            wins[s] = n_window(c, s)
        if some_n(wins[s], p * 10 ** a, p * 10 ** a + 10 ** a - 1):
            return True
    return False


# ----------------------------------------------------------------------------- constraint pools

BOUND_POOL = ["-25", "-2.5", "-1", "-0.01", "0", "0.5", "1", "3", "7.25", "10", "20", "30", "100", "1000"]
MULT_POOL = [None, None, "0.5", "0.01", "3", "2", "0.25", "7", "1.5", "12"]


def random_constraints(rng):
    lo = rng.choice(BOUND_POOL + [None, None])
    hi = rng.choice(BOUND_POOL + [None, None])
    lo_x = rng.random() < 0.35
    hi_x = rng.random() < 0.35
    mult = rng.choice(MULT_POOL)
    return {"lo": lo, "hi": hi, "lo_x": lo_x, "hi_x": hi_x, "mult": mult, "integer": rng.random() < 0.3}


def num(t):
    f = Fraction(t)
    return int(f) if f.denominator == 1 else float(t)


def schema_of(k, draft4=False):
    s = {"type": "integer" if k["integer"] else "number"}
    for name, bx, key in (("lo", "lo_x", "minimum"), ("hi", "hi_x", "maximum")):
        if k[name] is None:
            continue
        if draft4:
            s[key] = num(k[name])
            if k[bx]:
                s["exclusiveM" + key[1:]] = True
        else:
            s[("exclusiveM" + key[1:]) if k[bx] else key] = num(k[name])
    if k["mult"] is not None:
        s["multipleOf"] = num(k["mult"])
    return s


def exact_of(k):
    return {"lo": None if k["lo"] is None else Fraction(k["lo"]), "lo_x": k["lo_x"],
            "hi": None if k["hi"] is None else Fraction(k["hi"]), "hi_x": k["hi_x"],
            "mult": None if k["mult"] is None else Fraction(k["mult"])}


def exact_schema(k):
    """The same constraints with Fraction values, for jsonschema's exact arithmetic."""
    s = {"type": "integer" if k["integer"] else "number"}
    e = exact_of(k)
    if e["lo"] is not None:
        s["exclusiveMinimum" if k["lo_x"] else "minimum"] = e["lo"]
    if e["hi"] is not None:
        s["exclusiveMaximum" if k["hi_x"] else "maximum"] = e["hi"]
    if e["mult"] is not None:
        s["multipleOf"] = e["mult"]
    return s


def schema_valid(k, text):
    v = Fraction(text)
    if v.denominator == 1:
        v = int(v)
    return jsonschema.Draft202012Validator(exact_schema(k)).is_valid(v)


def syntax_next(text, integer):
    """Bytes that keep `text` a JSON number prefix (the grammar's own syntax, integers without . e)."""
    out = []
    body = text[1:] if text.startswith("-") else text
    if not text:
        return list("-" + MANT)
    if text == "-":
        return list(MANT)
    if "e" in body:
        ex = body[body.index("e") + 1:]
        return list(MANT) + (["+", "-"] if not ex else [])
    if "." in body:
        return list(MANT) + (["e"] if not body.endswith(".") else [])
    if body != "0":
        out += list(MANT)
    if not integer:
        out += [".", "e"]
    return out


def complete(text):
    body = text[1:] if text.startswith("-") else text
    return bool(body) and body[-1].isdigit()


@pytest.mark.parametrize("seed", range(16))
def test_prefix_liveness_matches_oracle(seed):
    rng = random.Random(seed)
    grammars = []
    for _ in range(7):
        k = random_constraints(rng)
        schema = schema_of(k, draft4=rng.random() < 0.3)   # boolean exclusive* (draft 4) or numeric
        grammars.append((k, schema, [compile_schema(schema, backend=b) for b in BACKENDS]))
    for k, schema, gs in grammars:
        c = exact_of(k)
        lives = {}

        def live(t):
            if t not in lives:
                lives[t] = oracle_live(c, t, k["integer"])
            return lives[t]

        for walk in range(14):
            text = ""
            states = [g.start() for g in gs]
            for depth in range(7):
                for b in syntax_next(text, k["integer"]):
                    t = text + b
                    want = live(t)
                    for s, name in zip(states, BACKENDS):
                        got = s.clone().feed(t[-1].encode())
                        assert got == want, (name, schema, t, got, want)
                    if want and complete(t):
                        v = schema_valid(k, t)
                        for s in states:
                            s2 = s.clone()
                            assert s2.feed(t[-1].encode()) and s2.is_complete() == v, (schema, t, v)
                nxt = [b for b in syntax_next(text, k["integer"]) if live(text + b)]
                if not nxt:
                    break
                b = rng.choice(nxt)
                text += b
                for s in states:
                    assert s.feed(b.encode())


# ----------------------------------------------------------------------------- unit cases

def alive(schema, text, backend):
    return compile_schema(schema, backend=backend).start().feed(text.encode())


MAX30 = {"type": "number", "maximum": 30}
LIVE_CASES = [
    # maximum 30: a negative exponent rescues any mantissa; a positive one only grows it
    (MAX30, ["40", "31", "3e", "3e-", "3e0", "3e1", "3e-5", "3e-50", "4e0", "3139e", "3139e-", "0.0",
             "-9e9", "1" + "2" * 35], ["3e5", "3e05", "3e2", "4e1", "3139e5", "30e1", "1" + "2" * 36]),
    ({"type": "number", "maximum": 30, "exclusiveMaximum": True}, ["3e", "29.9"], ["3e1", "30e0"]),
    ({"type": "number", "exclusiveMaximum": 30}, ["3e", "3e0", "300e-1"], ["3e1", "300e1", "30e0"]),
    # multipleOf 0.5: the exponent can absorb any fraction
    ({"type": "number", "multipleOf": 0.5}, ["1.23", "1.23e", "1.23e0", "1.25e0", "1.2e1", "1.75"], ["1.23e-", "1.25e-", "1.2e-", "0.3e-"]),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1}, ["0.99", "0.5", "1.0", "10e-1", "0.12e"],
     ["0.123e0", "1.01", "3e0", "-1", "2e0"]),
    # no completion of "5" lands in [10, 20]: every value starting with 5 is 5...*10**k
    ({"type": "number", "minimum": 10, "maximum": 20}, ["1", "2", "0", "0.2e2", "20", "1.9999e1"],
     ["5", "-", "21", "3", "0.3", "0.2e1"]),
    ({"type": "number", "minimum": 0, "multipleOf": 3}, ["-", "-0", "-0.0", "3", "1"], ["-1", "-0.1", "1e", "2e-"]),
    ({"type": "number", "exclusiveMinimum": 0, "multipleOf": 3}, ["0", "0.0", "0.3e1"], ["-", "0e", "0.0e"]),
    # integers: no '.'/'e', so only appended digits; range and multipleOf together
    ({"type": "integer", "minimum": 10, "maximum": 20, "multipleOf": 7}, ["1", "14"], ["2", "15", "-", "0"]),
    ({"type": "integer", "minimum": 0, "multipleOf": 5}, ["-", "-0", "5", "1"], ["-1", "1.", "1e"]),
    ({"type": "integer", "multipleOf": 0.5, "maximum": 3}, ["3", "-7"], ["4", "30"]),
    ({"type": "integer", "minimum": 1e39}, ["1", "9" * 38], ["-", "0"]),
    ({"type": "integer", "minimum": 1e40}, [], ["1", "9", "-"]),     # 41 digits never fit
    # the buffer: NUM_BUF bytes in all
    ({"type": "number"}, ["1" * 38 + ".", "1" * 38 + "e", "1" * 40], ["1" * 39 + ".", "1" * 39 + "e", "1" * 41]),
    ({"type": "number", "minimum": 0}, ["1" * 38 + "e", "0." + "0" * 38], ["1" * 39 + "e"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0." + "0" * 37], ["0." + "0" * 38, "-"]),
    # never a magnitude of 1e308 or more: a double would hold inf, which JSON cannot write
    ({"type": "number"}, ["1e307", "9.99e307", "-9e307", "0e999", "0.000e400", "0.001e310", "1e-400",
                          "1e+30", "10e306", "1" * 30 + "e278"],
     ["1e308", "1e400", "1E+308", "-1.5e308", "10e307", "0.01e310", "1" * 30 + "e279", "1e3080"]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", LIVE_CASES, ids=[json_id for json_id in map(str, range(len(LIVE_CASES)))])
def test_number_prefix_cases(case, backend):
    schema, live, dead = case
    for t in live:
        assert alive(schema, t, backend), (schema, t)
    for t in dead:
        assert not alive(schema, t, backend), (schema, t)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_numbers_are_finite_doubles(backend):
    """However long the exponent a walk writes, the finished number parses to a finite float."""
    import json
    import math
    rng = random.Random(11)
    g = compile_schema({"type": "array", "items": {"type": "number"}}, backend=backend)
    for _ in range(300):
        st = g.start()
        text = "[" + rng.choice(["", "-"]) + rng.choice(["1", "9.5", "0.02", "123"]) + "e"
        st.feed(text.encode())
        while True:
            digits = [d for d in "0123456789" if st.clone().feed(d.encode())]
            if not digits or rng.random() < 0.15:
                break
            d = rng.choice(digits)
            st.feed(d.encode())
            text += d
        if text.endswith("e"):
            continue
        assert st.clone().feed(b"]"), text
        assert all(math.isfinite(x) for x in json.loads(text + "]")), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_live_prefix_completes_within_the_buffer(backend):
    """Walk random live bytes to the buffer's end: the state never strands (a delimiter finishes it)."""
    rng = random.Random(7)
    schemas = [MAX30, {"type": "number", "multipleOf": 0.01, "minimum": -1, "maximum": 1},
               {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-30},
               {"type": "integer", "minimum": -5, "maximum": 1e38, "multipleOf": 7}]
    for schema in schemas:
        g = compile_schema({"type": "array", "items": schema}, backend=backend)
        for _ in range(25):
            s = g.start()
            assert s.feed(b"[")
            for _ in range(NUM_BUF + 2):
                nxt = [b for b in b"0123456789-+.eE" if s.clone().feed(bytes([b]))]
                if not nxt:
                    break
                assert s.feed(bytes([rng.choice(nxt)]))
            assert s.clone().feed(b"]") or s.clone().feed(b",")   # a live number always finishes


NUMBER_SCHEMAS = [
    {"type": "array", "items": {"type": "number", "maximum": 30, "multipleOf": 0.5}},
    {"type": "array", "items": {"type": ["integer", "string"], "minimum": -3, "exclusiveMaximum": 100}},
    {"type": "array", "items": {"anyOf": [{"type": "integer", "multipleOf": 4, "minimum": 8},
                                          {"type": "number", "exclusiveMinimum": -1, "maximum": -0.25}]}},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": 16, "maximum": 30},
                                      "b": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.01},
                                      "n": {"type": "integer", "minimum": 1, "maximum": 12}}},
    {"type": "array", "items": {"type": "number", "minimum": 2.5e-7, "maximum": 3.125e5, "multipleOf": 1.25e-7}},
]


def test_cython_equals_reference_on_number_streams():
    rng = random.Random(99)
    alphabet = b'0123456789-+.eE,[]{}"tbn: '
    for schema in NUMBER_SCHEMAS:
        gc = compile_schema(schema, backend="cython")
        gp = compile_schema(schema, backend="python")
        for _ in range(40):
            sc, sp = gc.start(), gp.start()
            for _ in range(60):
                if rng.random() < 0.2:
                    b = rng.choice(alphabet)
                else:
                    cands = [b for b in alphabet if sp.clone().feed(bytes([b]))]
                    if not cands:
                        break
                    b = rng.choice(cands)
                a, c = sc.feed(bytes([b])), sp.feed(bytes([b]))
                assert a == c, (schema, b)
                if not a:
                    break
                assert sc.is_complete() == sp.is_complete()


def test_bounds_beyond_the_exponent_limit_are_refused(monkeypatch):
    """(JSON numbers stay far inside 10**+-MAX_NUM_EXP: floats end near 1e308, and Python refuses
    to print ints over 4300 digits; the limit is tested lowered.)"""
    from needle_cy.errors import GrammarLimitError
    from needle_cy.grammar import builder
    compile_schema({"type": "number", "maximum": 10 ** 400, "multipleOf": 1e-300})
    monkeypatch.setattr(builder, "MAX_NUM_EXP", 100)      # the module that reads the limit
    with pytest.raises(GrammarLimitError, match="maximum"):
        compile_schema({"type": "number", "maximum": 1e200})
    with pytest.raises(GrammarLimitError, match="multipleOf"):
        compile_schema({"type": "number", "multipleOf": 1e-120})


WIDE_BOUNDS = BOUND_POOL + ["1e-30", "-7e-12", "2.5e20", "123456789.125", "-999999", "0.000123"]
WIDE_MULTS = MULT_POOL + ["1e-20", "0.0625", "999", "1e10", "0.3"]


def test_walks_to_the_buffer_end_agree_and_never_strand():
    """Random live bytes up to the buffer's end, on wider constraints: both engines agree on
    every candidate byte, and where no byte is live any more the number is complete and valid
    (so 'alive' was never claimed without a completion inside the buffer)."""
    rng = random.Random(2024)
    for _ in range(80):
        k = {"lo": rng.choice(WIDE_BOUNDS + [None]), "hi": rng.choice(WIDE_BOUNDS + [None]),
             "lo_x": rng.random() < 0.3, "hi_x": rng.random() < 0.3, "mult": rng.choice(WIDE_MULTS),
             "integer": rng.random() < 0.25}
        schema = {"type": "array", "items": schema_of(k)}
        gc, gp = (compile_schema(schema, backend=b) for b in ("cython", "python"))
        for _ in range(8):
            sc, sp = gc.start(), gp.start()
            assert sc.feed(b"[") and sp.feed(b"[")
            text = ""
            while True:
                cands = [b for b in syntax_next(text, k["integer"])
                         if sp.clone().feed(b.encode())]
                for b in syntax_next(text, k["integer"]):
                    assert sc.clone().feed(b.encode()) == (b in cands), (schema, text + b)
                if not cands:
                    break
                b = rng.choice(cands)
                text += b
                assert sc.feed(b.encode()) and sp.feed(b.encode())
            assert len(text) <= NUM_BUF
            if text:   # stranded nowhere: the number ends here and is valid
                assert sc.clone().feed(b"]") and sp.clone().feed(b"]"), (schema, text)
                ex = text.lower().split("e")[1] if "e" in text.lower() else "0"
                if abs(int(ex)) <= 400:   # (exact fractions of 10**huge are out of reach)
                    assert schema_valid(k, text), (schema, text)


@pytest.mark.parametrize("value_schema", [
    {"type": "integer", "minimum": 0.5, "maximum": 0.7},
    {"type": "number", "minimum": 5, "maximum": 3},
    {"type": "integer", "multipleOf": 2, "minimum": 3, "maximum": 3},
    {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 2, "multipleOf": 1},
    {"enum": []},
])
def test_a_property_no_value_can_satisfy_is_refused_at_its_key(value_schema):
    from needle_cy.grammar import compile_schema
    schema = {"type": "object", "properties": {"a": value_schema, "b": {"type": "integer"}},
              "additionalProperties": False}
    g = compile_schema(schema)
    assert not g.start().feed(b'{"a')            # no dead end after the key
    s = g.start()
    assert s.feed(b'{"b":4}') and s.is_complete()
    # a satisfiable alternative of a type list survives
    g = compile_schema({"type": "object", "properties": {
        "a": {"type": ["integer", "string"], "minimum": 0.5, "maximum": 0.7}}})
    assert g.start().feed(b'{"a":"x"}') and not g.start().feed(b'{"a":1')
