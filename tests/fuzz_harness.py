"""Fuzz harness: the archive reader, the tokenizer record and encoder, Model inputs, the grammar.

Every target takes one byte string and reads its choices from it (``Src``), so the same
target runs under a seeded random byte source (the test suite, ``tests/test_fuzz.py``, a
short budget) and under atheris (coverage-guided, where it installs).  A target raises
``Finding`` for a bug; anything it does not catch is a bug too:

* archive: mutated archives -> ``CactFormatError``, or the archive opens, every record reads,
  and the model loads with defaults and runs two tokens;
* tokenizer record / encoder: mutated records -> ``TokenizerError`` or a working tokenizer;
  random texts -> ids in range, decodable;
* model inputs: random id containers -> ``TokenizerError`` / ``ContextOverflowError`` or
  finite logits;
* grammar: random schemas -> a compiled grammar or a named error (UnsupportedSchemaError,
  GrammarLimitError, SchemaError); then documents -- random values and the grammar's own
  byte-level walks -- where every accepted document must parse as JSON and be valid for
  ``jsonschema`` (format checker on, decimals exact): rule zero, differential.

Long campaign (documented in the README):

    NEEDLE_CY_THREADS=1 nice -n 19 python tests/fuzz_harness.py grammar --docs 100000 --seed 1
    python tests/fuzz_harness.py grammar --atheris -- -max_total_time=3600   # needs atheris

Every finding becomes a fixed case in tests/test_grammar_exactness.py (or the module of
the component it concerns).
"""
import argparse
import decimal
import json
import random
import re
import struct
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from grammar_helpers import oracle_validator_class  # noqa: E402  (tests/ is this script's folder)
from needle_cy import NeedleError  # noqa: E402
from needle_cy.errors import (  # noqa: E402
    CactFormatError, ContextOverflowError, GrammarLimitError, SchemaError, TokenizerError,
    UnsupportedSchemaError,
)


class Finding(AssertionError):
    """A bug found by a target (false accept, wrong error type, engine disagreement)."""


class Src:
    """Choices read from a byte string (exhausted: zeros), as atheris' data provider would."""

    def __init__(self, data):
        self.data = data
        self.i = 0

    def u32(self):
        chunk = self.data[self.i:self.i + 4]
        self.i += 4
        return int.from_bytes(chunk.ljust(4, b"\0"), "little")

    def int(self, lo, hi):
        return lo + self.u32() % (hi - lo + 1)

    def bool(self, p=0.5):
        return self.u32() < p * 2 ** 32

    def choice(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def random(self):
        """A random.Random seeded from the next choice (for bulk, unstructured draws)."""
        return random.Random(self.u32())


# ----------------------------------------------------------------------------- grammar

STRINGS = ["", "a", "ab", "abc", "x", "aaa", "A", "0", "12", "a\n", "\n", "\r", "\t", " ", "\u2028",
           "\u0663", "\ufeff", "\x1c", "\u00e9", "\u00a0", "z" * 9, "2024-02-29", "2023-02-29",
           "1900-02-29", "2000-02-29", "2024-13-01", "0000-01-01", "2024-01-01", "12:00:00Z",
           "23:59:60Z", "12:00:00.1234567890Z", "2024-01-01T12:00:00Z", "2024-02-29T23:59:60Z",
           "a@b.co", "a@[1.2.3.4]", '"a b"@c.d', "x@y", "1.2.3.4", "01.2.3.4", "256.1.1.1",
           "123e4567-e89b-12d3-a456-426614174000", "http://a.b/c", "a:[b", "\U0001F600", "é",
           "foo", "bar", "key", "k1", "_", "-", "{", "}"]
NUMBERS = [0, 1, -1, 2, 3, 5, 10, 0.5, 1.5, -2.5, 100, 1e3, 2.0, 1.0, 7, 1e-3, 12345678901234567890]
PATTERN_ATOMS = ["a", "b", "x", ".", "\\d", "\\w", "\\s", "\\D", "\\W", "\\S", "[a-c]", "[^a]", "[^\\d]",
                 "[\\s\\d]", "[0-9]", "\\n", "\\r", "é", "\\u00e9", "(?:a|b)", "(a|bc)", "\\.", "-", "_"]
FORMATS = ["date", "email", "ipv4", "uuid", "time", "date-time"]
KEYS = ["a", "b", "k1", "\r", "a\n", "é", "x", "_"]
D4 = "http://json-schema.org/draft-04/schema#"


def gen_pattern(src):
    parts = []
    for _ in range(src.int(1, 4)):
        atom = src.choice(PATTERN_ATOMS)
        q = src.choice(["", "", "", "*", "+", "?", "{2}", "{1,3}"])
        parts.append(atom + q)
    body = "".join(parts)
    if src.bool(0.2):
        body = body + "|" + src.choice(PATTERN_ATOMS)
    return ("^" if src.bool(0.5) else "") + body + ("$" if src.bool(0.5) else "")


def gen_schema(src, depth=0, draft4=False, ref=True):
    if depth > 3 or src.bool(0.15):
        return src.choice([True, False, {}, {"type": "string"}, {"type": "integer"}, {"type": "null"}])
    kind = src.int(0, 13 if ref else 12)
    s = {}
    if kind == 0:
        s["type"] = src.choice(["string", "number", "integer", "boolean", "null", "array", "object",
                                ["string", "null"], ["integer", "string"]])
    elif kind == 1:
        pool = STRINGS + NUMBERS + [None, True, False, [], {}, [1], {"a": 1}]
        s["enum"] = [src.choice(pool) for _ in range(src.int(1, 4))]
        if src.bool(0.3):
            s["type"] = src.choice(["integer", "string", "number"])
    elif kind == 2:
        s["type"] = "string"
        if src.bool(0.5):
            s["pattern"] = gen_pattern(src)
        if src.bool(0.3):
            s["format"] = src.choice(FORMATS)
        if src.bool(0.3):
            s["minLength"] = src.int(0, 3)
        if src.bool(0.3):
            s["maxLength"] = src.choice([0, 1, 2, 5, 2 ** 31, 2 ** 40])
    elif kind == 3:
        s["type"] = src.choice(["number", "integer"])
        for kw in ("minimum", "maximum", "multipleOf"):
            if src.bool(0.4):
                s[kw] = src.choice([0, 1, 2, 0.5, 3, -1, 10, 0.1] if kw != "multipleOf" else [1, 2, 0.5, 0.1, 3])
        if src.bool(0.3):
            if draft4:
                s["exclusiveMinimum" if src.bool() else "exclusiveMaximum"] = True
            else:
                s[src.choice(["exclusiveMinimum", "exclusiveMaximum"])] = src.choice([0, 1, 2.5])
    elif kind == 4:
        s["type"] = "array"
        if src.bool(0.6):
            s["items"] = gen_schema(src, depth + 1, draft4)
        if not draft4 and src.bool(0.3):
            s["prefixItems"] = [gen_schema(src, depth + 1, draft4) for _ in range(src.int(1, 2))]
        if src.bool(0.3):
            s["minItems"] = src.int(0, 2)
        if src.bool(0.3):
            s["maxItems"] = src.int(0, 3)
        if src.bool(0.2):
            s["uniqueItems"] = True
    elif kind == 5:
        s["type"] = "object"
        names = sorted({src.choice(KEYS) for _ in range(src.int(0, 3))})
        if names:
            s["properties"] = {n: gen_schema(src, depth + 1, draft4) for n in names}
            if src.bool(0.5):
                s["required"] = names[: src.int(1, len(names))]
        if src.bool(0.3):
            s["patternProperties"] = {gen_pattern(src): gen_schema(src, depth + 1, draft4)}
        if src.bool(0.4):
            s["additionalProperties"] = gen_schema(src, depth + 1, draft4)
        if src.bool(0.2):
            s["propertyNames"] = src.choice([{"pattern": gen_pattern(src)}, {"maxLength": 2},
                                             {"enum": ["a", "b", "\r"]}, {"format": "date"}])
        if src.bool(0.2):
            s[src.choice(["minProperties", "maxProperties"])] = src.int(0, 2)
        if src.bool(0.15) and not draft4:
            s["dependentRequired"] = {src.choice(KEYS): [src.choice(KEYS)]}
    elif kind == 6:
        s["not"] = gen_schema(src, depth + 1, draft4)
    elif kind in (7, 8):
        s[src.choice(["anyOf", "oneOf", "allOf"])] = [gen_schema(src, depth + 1, draft4)
                                                      for _ in range(src.int(1, 3))]
    elif kind == 9:
        s["if"] = gen_schema(src, depth + 1, draft4)
        if src.bool(0.7):
            s["then"] = gen_schema(src, depth + 1, draft4)
        if src.bool(0.7):
            s["else"] = gen_schema(src, depth + 1, draft4)
    elif kind == 10:
        s["const"] = src.choice(STRINGS + NUMBERS + [None, True, [1, "a"], {"a": [1]}])
    elif kind == 11:
        s["not"] = {src.choice(["pattern", "format", "enum", "minLength", "maximum", "required", "type"]): None}
        k = next(iter(s["not"]))
        s["not"][k] = {"pattern": gen_pattern(src), "format": src.choice(FORMATS),
                       "enum": [src.choice(STRINGS) for _ in range(2)], "minLength": src.int(0, 3),
                       "maximum": src.choice([0, 1.5, 10]), "required": [src.choice(KEYS)],
                       "type": src.choice(["string", "number", "null", "object"])}[k]
    elif kind == 12:
        s["type"] = src.choice(["string", "object", "array"])
        s[src.choice(["__not_strings", "__not_pattern", "__ptr", "__not_format"])] = \
            src.choice([["a"], "a", "#", "date", 5])
    else:
        s["$ref"] = "#/$defs/d" if not draft4 else "#/definitions/d"
    return s


def gen_root(src):
    draft4 = src.bool(0.15)
    schema = gen_schema(src, 0, draft4)
    if isinstance(schema, dict):
        schema = dict(schema)
        defs = "definitions" if draft4 else "$defs"
        schema[defs] = {"d": gen_schema(src, 2, draft4, ref=False)}   # no bare self-reference
        if draft4:
            schema["$schema"] = D4
    return schema


def gen_value(src, depth=0):
    k = src.int(0, 9 if depth < 2 else 5)
    if k <= 2:
        return src.choice(STRINGS)
    if k == 3:
        return src.choice(NUMBERS)
    if k == 4:
        return src.choice([None, True, False])
    if k == 5:
        return src.choice([1.0, 2.5, -0.0, 3, "a"])
    if k <= 7:
        return [gen_value(src, depth + 1) for _ in range(src.int(0, 3))]
    return {src.choice(KEYS): gen_value(src, depth + 1) for _ in range(src.int(0, 3))}


WALK_ALPHABET = sorted(set(b'{}[],:"\\-+.0123456789eEtrufalsnbxyzABk_ @/') | {0x0A, 0x0D, 0xC3, 0xA9, 0xE2, 0x80, 0xA8})


def walk(src, grammar, max_len=60):
    """A byte-level walk that only takes bytes the grammar allows; stops when complete
    (sometimes) or stuck."""
    rng = src.random()
    st = grammar.start()
    out = bytearray()
    for _ in range(max_len):
        if st.is_complete() and rng.random() < 0.3:
            break
        cands = [b for b in WALK_ALPHABET if st.clone().feed(bytes([b]))]
        if not cands:
            break
        b = rng.choice(cands)
        st.feed(bytes([b]))
        out.append(b)
    return bytes(out)


def _oracle(schema):
    cls = oracle_validator_class(schema)
    exact = json.loads(json.dumps(schema), parse_float=Decimal)
    return cls(exact, format_checker=cls.FORMAT_CHECKER)


class GrammarStats:
    def __init__(self):
        self.schemas = self.compiled = self.docs = self.accepted = self.unjudged = 0
        self.errors = {}

    def line(self):
        return (f"{self.schemas} schemas ({self.compiled} compiled), {self.docs} documents, "
                f"{self.accepted} accepted, {self.unjudged} unjudged, 0 false accepts")


NAMED = (UnsupportedSchemaError, GrammarLimitError, SchemaError)


def grammar_target(data, stats=None, docs=24, walks=8, twin_every=4):
    """One random schema: compile, then differential on random values and on walks."""
    from needle_cy.grammar import compile_schema
    stats = stats or GrammarStats()
    src = Src(data)
    schema = gen_root(src)
    stats.schemas += 1
    try:
        g = compile_schema(schema)
    except NAMED as exc:
        stats.errors[type(exc).__name__] = stats.errors.get(type(exc).__name__, 0) + 1
        return stats
    except RecursionError:
        raise Finding(f"RecursionError compiling {schema!r}") from None
    except Exception as exc:
        raise Finding(f"compile_schema raised {type(exc).__name__}: {exc} for {schema!r}") from exc
    stats.compiled += 1
    try:
        validator = _oracle(schema)
        import jsonschema
        type(validator).check_schema(schema)
    except Exception:  # noqa: BLE001 -- not a schema jsonschema can judge
        return stats
    twin = None
    documents = []
    for _ in range(docs):
        v = gen_value(src)
        documents.append(json.dumps(v, separators=(",", ":"), ensure_ascii=src.bool(0.1)).encode())
    for _ in range(walks):
        documents.append(walk(src, g))
    for i, d in enumerate(documents):
        stats.docs += 1
        ok = g.accepts(d)
        if i % twin_every == 0:
            if twin is None:
                twin = compile_schema(schema, backend="python")
            if twin.accepts(d) != ok:
                raise Finding(f"Cython and Python runtimes disagree on {d!r} for {schema!r}")
        if not ok:
            continue
        stats.accepted += 1
        with decimal.localcontext() as ctx:
            ctx.Emax, ctx.Emin, ctx.prec = decimal.MAX_EMAX, decimal.MIN_EMIN, 4000
            try:
                value = json.loads(d, parse_float=Decimal)
            except ValueError:
                raise Finding(f"accepted a document that is not JSON: {d!r} for {schema!r}") from None
            except decimal.DecimalException:
                stats.unjudged += 1   # a number beyond Decimal's exponent range
                continue
            try:
                valid = validator.is_valid(value)
            except (re.error, decimal.DecimalException, RecursionError, TypeError):
                stats.unjudged += 1
                continue
            except BaseException as exc:
                # the oracle's Rust reference resolver (rpds, through pyo3) turns a deep
                # recursion into a PanicException, a BaseException: unjudged as well
                if type(exc).__name__ != "PanicException":
                    raise
                stats.unjudged += 1
                continue
        if not valid:
            raise Finding(f"FALSE ACCEPT: {d!r} for {json.dumps(schema)}")
    return stats


# ----------------------------------------------------------------------------- archive

_BASE = {}


def _tiny_record(n=24):
    out = bytearray(struct.pack("<5IBBH", n, 0, 1, 2, 3, 1, 1, 0))
    pieces = [(b"<0x%02X>" % i, 4) for i in range(8)] + [("\u2581p%d" % i).encode() for i in range(n - 8)]
    for i, p in enumerate(pieces):
        surface, ptype = (p if isinstance(p, tuple) else (p, 0 if i > 3 else 2))
        out += struct.pack("<fBH", -float(i), ptype, len(surface)) + surface
    return bytes(out)


def base_archive():
    if "archive" not in _BASE:
        import tempfile

        from needle_cy.archive import write_archive
        from needle_cy.testing import random_config, random_tensors
        cfg = random_config(layers=2, d_model=64, vocab=128, engram_slots=7, engram_sites=(0, 1),
                            global_layers=(1,), num_heads=4, num_kv_heads=2, qk_head_dim=8, v_head_dim=8,
                            mhc_lanes=2, max_seq_len=64, sliding_window=8)
        tensors = random_tensors(cfg, seed=1, heads=True, head_probes=2, head_queries=2, embedding_dim=8)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "base.cact"
            write_archive(path, cfg, tensors, bits=4, group_size=64, tokenizer_bytes=_tiny_record())
            _BASE["archive"] = path.read_bytes()
    return _BASE["archive"]


def archive_target(data):
    from needle_cy import Model
    from needle_cy.archive import Archive
    src = Src(data)
    blob = bytearray(base_archive())
    tail = len(_tiny_record())
    for _ in range(src.int(1, 3)):
        # every mutation reads the blob's length now: an earlier truncation may have left
        # fewer bytes than the header, the directory or the tokenizer record hold (even none)
        k = src.int(0, 3)
        if k == 0:     # a header or directory u32 set to an edge value
            words = min(48 + 11 * 8, len(blob) // 4 - 1)
            if words < 0:
                continue
            struct.pack_into("<I", blob, 4 * src.int(0, words),
                             src.choice([0, 1, 2, 3, 4, 7, 64, 65, 2 ** 16, 2 ** 24 - 1, 2 ** 31 - 1, 2 ** 31,
                                         2 ** 32 - 1]))
        elif k == 1:   # byte flips anywhere
            for _ in range(src.int(1, 4)):
                if blob:
                    blob[src.int(0, len(blob) - 1)] ^= 1 << src.int(0, 7)
        elif k == 2:   # truncation
            if blob:
                del blob[src.int(0, len(blob) - 1):]
        else:          # flips in the tokenizer record (the tail of the file)
            for _ in range(src.int(1, 3)):
                if blob:
                    blob[len(blob) - 1 - src.int(0, min(tail, len(blob)) - 1)] ^= 1 << src.int(0, 7)
    try:
        arc = Archive.from_bytes(bytes(blob))
    except CactFormatError:
        return "refused"
    for rec in arc.records:
        arc.dequantize(rec.index) if rec.dtype != 4 else arc.tensor(rec.index)
    model = Model.load(arc, threads=1)
    n = min(2, model.max_seq_len)
    logits = model.prefill(list(range(1, n + 1)))
    if not np.isfinite(np.asarray(logits)).all():
        raise Finding("non-finite logits from an archive that validated")
    if arc.tokenizer_bytes is not None:
        from needle_cy import Tokenizer
        Tokenizer.from_archive(arc).encode("ab p1")
    return "opened"


def tokenizer_record_target(data):
    from needle_cy import Tokenizer
    from needle_cy.tokenizer_record import parse_tokenizer_record
    src = Src(data)
    rec = bytearray(_tiny_record())
    for _ in range(src.int(1, 4)):
        rec[src.int(0, len(rec) - 1)] = src.int(0, 255)
    try:
        record = parse_tokenizer_record(bytes(rec))
    except TokenizerError:
        return "refused"
    tok = Tokenizer(record)
    text = "".join(src.choice(["p1", " ", "\u2581", "x", "é", "\n", "<0x41>", "\U0001F600"]) for _ in range(6))
    ids = tok.encode(text)
    if any(not 0 <= i < tok.vocab_size for i in ids):
        raise Finding(f"encode gave an id out of range: {ids}")
    tok.decode(ids)
    return "parsed"


_DEFAULT = {}


def _default_tokenizer():
    if "tok" not in _DEFAULT:
        import needle_cy
        from needle_cy import Tokenizer
        _DEFAULT["tok"] = Tokenizer.from_archive(Path(needle_cy.__file__).parent / "models" / "default.cact")
    return _DEFAULT["tok"]


def encoder_target(data):
    from needle_cy.tokenizer import CHAT_MARKERS
    tok = _default_tokenizer()
    src = Src(data)
    rng = src.random()
    pool = ["a", " ", "  ", "\u2581", "é", "\n", "\t", "\U0001F600", "\ud800", "\x00", "<think>", "<|im_end|>",
            "<0x41>", "lock the door", "日本", "\u200b", "\ufffd"] + list(CHAT_MARKERS)
    text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 20)))
    try:
        ids = tok.encode(text, dummy_prefix=src.bool())
    except TokenizerError:
        if not any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            raise Finding(f"TokenizerError for a text without surrogates: {text!r}") from None
        return "refused"
    if any(not 0 <= i < tok.vocab_size for i in ids):
        raise Finding(f"id out of range for {text!r}")
    if not isinstance(tok.decode(ids), str):
        raise Finding("decode did not give a str")
    return "encoded"


def model_inputs_target(data):
    src = Src(data)
    if "model" not in _DEFAULT:
        from needle_cy import Model
        from needle_cy.archive import Archive
        _DEFAULT["model"] = Model.load(Archive.from_bytes(base_archive()), threads=1)
    model = _DEFAULT["model"]
    model.reset()
    V = model.vocab_size
    k = src.int(0, 9)
    ids = {0: lambda: [src.int(0, V - 1) for _ in range(src.int(1, 5))],
           1: lambda: [src.int(0, V * 2) - V for _ in range(src.int(1, 5))],
           2: lambda: [True, False][: src.int(1, 2)],
           3: lambda: [1.0, 2.5, float("nan"), 1e300][: src.int(1, 4)],
           4: lambda: np.array([src.int(0, V - 1)], dtype=src.choice([np.int8, np.uint64, np.float32, np.int64])),
           5: lambda: [],
           6: lambda: [[1, 2], [3]],
           7: lambda: [[1, 2], [3, 4]],
           8: lambda: ["a", 1],
           9: lambda: [src.int(0, V - 1)] * src.int(60, 70)}[k]()
    call = src.choice(["prefill", "forward", "step"])
    try:
        out = getattr(model, call)(ids)
    except (TokenizerError, ContextOverflowError):
        return "refused"
    if not np.isfinite(np.asarray(out)).all():
        raise Finding(f"non-finite logits for {call}({ids!r})")
    return "ran"


TARGETS = {"grammar": grammar_target, "archive": archive_target, "tokenizer_record": tokenizer_record_target,
           "encoder": encoder_target, "model_inputs": model_inputs_target}


def run_random(target, cases, seed, stats=None):
    """``cases`` seeded random inputs through a target; returns the outcome counts."""
    rng = random.Random(seed)
    counts = {}
    for _ in range(cases):
        data = rng.randbytes(512)
        try:
            out = TARGETS[target](data, stats) if target == "grammar" else TARGETS[target](data)
        except Finding:
            raise
        except NeedleError as exc:
            if target != "grammar":
                raise Finding(f"{target}: unexpected {type(exc).__name__}: {exc}") from exc
            raise
        key = out if isinstance(out, str) else "ok"
        counts[key] = counts.get(key, 0) + 1
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000, help="inputs (non-grammar targets)")
    ap.add_argument("--docs", type=int, default=0, help="grammar: run until this many documents")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided with atheris; rest to libFuzzer")
    args, rest = ap.parse_known_args(argv)
    if args.atheris:
        import atheris
        fn = TARGETS[args.target]
        atheris.Setup([sys.argv[0]] + [a for a in rest if a != "--"], lambda data: fn(data))
        atheris.Fuzz()
        return 0
    t0 = time.time()
    if args.target == "grammar" and args.docs:
        stats = GrammarStats()
        seed = args.seed
        while stats.docs < args.docs:
            run_random("grammar", 50, seed, stats)
            seed += 1000003
            print(f"[{time.time() - t0:7.0f} s] {stats.line()}", flush=True)
        print("compile errors:", stats.errors)
        return 0
    stats = GrammarStats()
    counts = run_random(args.target, args.cases, args.seed, stats)
    print(args.target, counts, stats.line() if args.target == "grammar" else "", f"{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
