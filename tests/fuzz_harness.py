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
* untrusted text: random strings full of marker spellings as the system facts, a tool's
  description and schema strings (a field's description, an enum member), the query, the tool results and a follow-up
  query of a three-turn conversation (a scripted model, the default tokenizer) -> the
  conversation's marker ids are exactly the template's, and every string reads back;
* grammar: random schemas -> a compiled grammar or a named error (UnsupportedSchemaError,
  GrammarLimitError, SchemaError); then documents -- random values and the grammar's own
  byte-level walks -- where every accepted document must parse as JSON and be valid for
  ``jsonschema`` (format checker on, decimals exact): rule zero, differential.

Campaigns (docs/grammar-fuzzing.md has their sizes and dates): many seeds in parallel worker
processes under a time budget; every finding is collected, deduplicated by a shape key and
written as a reproducer file (outside the repository by default), which ``--replay`` runs:

    nice -n 15 python tests/fuzz_harness.py grammar --campaign --seeds 9001-9020 --docs 1000000 \
        --workers 2 --budget-s 3600 --backend cython --record /tmp/grammar.json
    nice -n 15 python tests/fuzz_harness.py archive --campaign --seeds 9101-9120 --cases 100000
    python tests/fuzz_harness.py --replay /tmp/needle_cy_fuzz_findings/grammar-cython-9001-17.json
    NEEDLE_CY_THREADS=1 python tests/fuzz_harness.py grammar --docs 100000 --seed 1   # one seed, stops at a finding
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
# the $schema of a generated root (None: none, read as 2020-12) and its odds: every draft
# reads keywords of its own (a keyword of another draft is an annotation there)
DRAFTS = [(None, 0.66), ("http://json-schema.org/draft-03/schema#", 0.02), (D4, 0.15),
          ("http://json-schema.org/draft-06/schema#", 0.05), ("http://json-schema.org/draft-07/schema#", 0.07),
          ("https://json-schema.org/draft/2019-09/schema", 0.03), ("https://json-schema.org/draft/2020-12/schema", 0.02)]


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
        if src.bool(0.3 if not draft4 else 0.1):   # (an annotation before 2020-12)
            s["prefixItems"] = [gen_schema(src, depth + 1, draft4) for _ in range(src.int(1, 2))]
        if draft4 and src.bool(0.2):
            s["items"] = [gen_schema(src, depth + 1, draft4) for _ in range(src.int(1, 2))]
            if src.bool(0.5):
                s["additionalItems"] = gen_schema(src, depth + 1, draft4)
        if src.bool(0.15):
            s["contains"] = gen_schema(src, depth + 1, draft4)
            if src.bool(0.3):
                s[src.choice(["minContains", "maxContains"])] = src.int(0, 2)
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
        if src.bool(0.15):
            # a oneOf beside the object's own keywords: alternatives compiled with them
            s["oneOf"] = [src.choice([{"required": [src.choice(KEYS)]},
                                      {"properties": {src.choice(KEYS): gen_schema(src, depth + 2, draft4)}},
                                      {"required": [src.choice(KEYS)],
                                       "properties": {src.choice(KEYS): gen_schema(src, depth + 2, draft4)}}])
                          for _ in range(src.int(2, 3))]
        if src.bool(0.15):
            s[src.choice(["dependentRequired", "dependencies"])] = {src.choice(KEYS): [src.choice(KEYS)]}
        if src.bool(0.1):
            s[src.choice(["dependentSchemas", "dependencies"])] = {src.choice(KEYS): gen_schema(src, depth + 1, draft4)}
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
    x = src.u32() / 2 ** 32
    for uri, odds in DRAFTS:
        if x < odds:
            break
        x -= odds
    draft4 = uri is not None and ("draft-04" in uri or "draft-03" in uri)   # boolean exclusive*, items lists
    schema = gen_schema(src, 0, draft4)
    if isinstance(schema, dict):
        schema = dict(schema)
        defs = "definitions" if draft4 else "$defs"
        schema[defs] = {"d": gen_schema(src, 2, draft4, ref=False)}   # no bare self-reference
        if uri is not None:
            schema["$schema"] = uri
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


def grammar_target(data, stats=None, docs=24, walks=8, twin_every=4, backend="cython"):
    """One random schema: compile (on ``backend``, every ``twin_every``-th document checked on
    the other runtime too), then differential on random values and on walks."""
    from needle_cy.grammar import compile_schema
    stats = stats or GrammarStats()
    src = Src(data)
    schema = gen_root(src)
    stats.schemas += 1
    try:
        g = compile_schema(schema, backend=backend)
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
                twin = compile_schema(schema, backend="python" if backend == "cython" else "cython")
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
            except (re.error, decimal.DecimalException, RecursionError, TypeError, AttributeError):
                # the oracle cannot judge (an AttributeError: draft 3's properties reading a
                # boolean subschema, which its meta-schema leaves unchecked under definitions)
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


_UNTRUSTED_POOL = None


def _untrusted_string(rng):
    """Random text mixing every marker spelling, pieces of them, control and byte-piece
    spellings, JSON-hostile characters and ordinary words."""
    global _UNTRUSTED_POOL
    if _UNTRUSTED_POOL is None:
        from needle_cy.tokenizer import CHAT_MARKERS
        _UNTRUSTED_POOL = list(CHAT_MARKERS) + [
            "<s>", "</s>", "<unk>", "<pad>", "<0x41>", "<0x3C>", "<|im_", "_end|>", "<tool", "_call>", "</",
            "<", ">", "|", "/", "\n", " ", "  ", "\t", '"', "\\", "{", "}", "[", "]", "a", "lock", " door", "é",
            "\U0001F600", "日本", "\u200b", "\x00"]
    return "".join(rng.choice(_UNTRUSTED_POOL) for _ in range(rng.randint(0, 14)))


def untrusted_text_target(data):
    import json as json_mod

    from needle_cy.agent import Needle
    from needle_cy.prompt import compact_json
    from scripted_support import ScriptedModel
    tok = _default_tokenizer()
    src = Src(data)
    rng = src.random()
    texts = {k: _untrusted_string(rng) for k in ("system", "description", "field", "value",
                                                      "query", "result", "follow_up")}
    texts["query"] = "q" + texts["query"]           # a blank request is refused before encoding
    texts["follow_up"] = "f" + texts["follow_up"]
    if not src.bool(0.25):   # most cases keep the grammar of the last (compiling it is the slow part)
        texts["value"] = ""
    name = "act"      # a tool name is letters, digits and _.:- (the grammar compiler checks)
    spec = {"name": name, "description": texts["description"],
            "parameters": {"type": "object", "required": ["v"], "properties": {
                "v": {"type": "string", "description": texts["field"], "enum": ["x", "x" + texts["value"]]}}}}
    call = compact_json([{"name": name, "arguments": {"v": "x"}}])
    if "scripted" not in _DEFAULT:
        _DEFAULT["scripted"] = ScriptedModel(tok, [f"<tool_call>{call}", "<tool_call>[]", "<tool_call>[]"])
    model = _DEFAULT["scripted"]
    agent = Needle(model, tools=[spec], system=texts["system"], tokenizer=tok, ground_values=False,
                   ground_notes=False, negation_gate=False, escalate_below=None, retrieval="bm25")
    compile_grammar = agent.compile_grammar

    def same_grammar_once(schemas, max_calls):
        key = (json_mod.dumps([s["parameters"]["properties"]["v"]["enum"] for s in schemas]), max_calls)
        if _DEFAULT.get("grammar_key") != key:
            _DEFAULT["grammar_key"], _DEFAULT["grammar"] = key, compile_grammar(schemas, max_calls)
        return _DEFAULT["grammar"]

    agent.compile_grammar = same_grammar_once
    first = agent.complete(texts["query"])
    results = [texts["result"], {"note": texts["result"]}]
    second = agent.complete(results)
    third = agent.complete(texts["follow_up"])
    if [r["type"] for r in (first, second, third)] != ["call", "respond", "refusal"]:
        raise Finding(f"the scripted turns went {[r['type'] for r in (first, second, third)]}: {texts!r}")
    ids = agent.conversation_ids()
    if model.history != ids:
        raise Finding("the model state holds other ids than the conversation")
    marker_ids = {tok.marker_id(m): m for m in tok.markers}
    special = [i for i in ids if i in marker_ids or tok.piece_type(i) in (1, 2)]
    got = [marker_ids.get(i, tok.piece(i)) for i in special]
    head = ["<|im_start|>", "<|im_end|>"] if texts["system"].strip() else []
    assistant = ["<tool_call>", "</tool_call>", "<|im_end|>"]
    want = (["<s>"] + head + ["<|im_start|>", "<tools>", "</tools>", "<|im_end|>", "<|im_start|>"] + assistant
            + ["<|im_start|>", "<tool_result>", "</tool_result>", "<|im_end|>", "<|im_start|>"] + assistant
            + ["<|im_start|>", "<|im_end|>", "<|im_start|>"] + assistant)
    if got != want:
        raise Finding(f"markers {got} where the template puts {want}: {texts!r}")
    shown = tok.decode(ids)
    for piece in (texts["system"].strip(), compact_json(texts["description"]),
                  compact_json(texts["field"]), compact_json("x" + texts["value"]), texts["query"],
                  json_mod.dumps(results), texts["follow_up"]):
        if piece not in shown:
            raise Finding(f"{piece!r} does not read back from the conversation")
    return "held"


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
           "encoder": encoder_target, "model_inputs": model_inputs_target, "untrusted_text": untrusted_text_target}


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


# ----------------------------------------------------------------------------- campaign
#
# Many seeds in parallel worker processes under a time budget.  A case is reproducible from
# (target, seed, index) alone (``case_bytes``), so any worker runs any chunk of any seed; every
# finding is collected (the campaign does not stop at the first), deduplicated by a shape key,
# and the smallest example of each shape is written as a reproducer file (JSON: the input
# bytes, what went wrong, the command that replays it).

CHUNK = {"grammar": 25, "archive": 400, "tokenizer_record": 500, "encoder": 500, "model_inputs": 200}


def case_bytes(target, seed, index):
    return random.Random(f"{target}:{seed}:{index}").randbytes(512)


def _schema_shape(node, inside_value=False):
    """The keywords a schema uses, enum/const values reduced to their JSON types: findings of
    one cause share it (their random leaves differ)."""
    out = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("enum", "const"):
                vals = v if k == "enum" and isinstance(v, list) else [v]
                out.add(f"{k}[{','.join(sorted({type(x).__name__ for x in vals}))}]")
            elif k in ("$schema",):
                out.add(f"$schema={v}")
            elif k in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                       "dependencies") and isinstance(v, dict):
                out.add(k)
                for x in v.values():
                    out |= _schema_shape(x)
            else:
                out.add(k)
                out |= _schema_shape(v)
    elif isinstance(node, list):
        for x in node:
            out |= _schema_shape(x)
    return out


def _crash_site(exc):
    """file:line of the innermost frame of the project (or the harness) in a traceback."""
    import traceback
    site = "?"
    for fr in traceback.extract_tb(exc.__traceback__):
        if "needle_cy" in fr.filename or "fuzz_harness" in fr.filename:
            site = f"{Path(fr.filename).name}:{fr.lineno}"
    return site


def run_case(target, data, stats=None, backend="cython"):
    """One case; returns (outcome, finding or None).  A finding is a dict with a shape ``key``."""
    try:
        if target == "grammar":
            grammar_target(data, stats, backend=backend)
            return "ok", None
        return TARGETS[target](data), None
    except Finding as exc:
        msg = str(exc)
        kind = msg.split(":")[0][:60]
        key = [target, kind]
        if target == "grammar":
            schema = gen_root(Src(data))
            key.append(" ".join(sorted(_schema_shape(schema))))
        return "finding", {"key": " | ".join(key), "message": msg[:4000]}
    except Exception as exc:   # noqa: BLE001 -- anything a target does not catch is a bug
        return "finding", {"key": f"{target} | crash | {type(exc).__name__} at {_crash_site(exc)}",
                           "message": f"{type(exc).__name__}: {str(exc)[:2000]}"}


def _worker_init():
    import os
    os.environ.setdefault("NEEDLE_CY_THREADS", "1")


def run_chunk(target, seed, chunk, n, backend, deadline):
    """Cases chunk*n .. chunk*n+n-1 of a seed (stopping at the deadline); returns counts."""
    stats = GrammarStats()
    counts, findings = {}, []
    done = 0
    for index in range(chunk * n, chunk * n + n):
        if time.time() > deadline:
            break
        data = case_bytes(target, seed, index)
        out, finding = run_case(target, data, stats, backend)
        done += 1
        counts[out] = counts.get(out, 0) + 1
        if finding:
            finding.update(seed=seed, index=index, data_hex=data.hex())
            findings.append(finding)
    return {"seed": seed, "cases": done, "counts": counts, "findings": findings,
            "grammar": {k: getattr(stats, k) for k in ("schemas", "compiled", "docs", "accepted", "unjudged")},
            "errors": stats.errors}


def campaign(target, seeds, goal, workers=2, budget_s=3600.0, backend="cython", findings_dir=None, log=print):
    """Seeds round-robin in chunks over ``workers`` processes until ``goal`` (grammar:
    documents, else cases) or the time budget; every finding kept, by shape key."""
    import concurrent.futures as cf
    import multiprocessing
    import tempfile
    t0 = time.time()
    deadline = t0 + budget_s
    n = CHUNK[target]
    tasks = ((seed, chunk) for chunk in range(10 ** 9) for seed in seeds)
    tot = {"cases": 0, "counts": {}, "errors": {},
           "grammar": {"schemas": 0, "compiled": 0, "docs": 0, "accepted": 0, "unjudged": 0}}
    per_seed = {s: 0 for s in seeds}
    shapes = {}    # key -> {"count", "example"}
    measure = (lambda: tot["grammar"]["docs"]) if target == "grammar" else (lambda: tot["cases"])
    last_log = t0
    ctx = multiprocessing.get_context("fork")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init) as pool:
        running = set()
        while True:
            while len(running) < 2 * workers and measure() < goal and time.time() < deadline:
                seed, chunk = next(tasks)
                running.add(pool.submit(run_chunk, target, seed, chunk, n, backend, deadline))
            if not running:
                break
            done, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                r = fut.result()
                tot["cases"] += r["cases"]
                per_seed[r["seed"]] += r["cases"]
                for k, v in r["counts"].items():
                    tot["counts"][k] = tot["counts"].get(k, 0) + v
                for k, v in r["grammar"].items():
                    tot["grammar"][k] += v
                for k, v in r["errors"].items():
                    tot["errors"][k] = tot["errors"].get(k, 0) + v
                for f in r["findings"]:
                    hit = shapes.setdefault(f["key"], {"count": 0, "example": f})
                    hit["count"] += 1
                    if len(f["message"]) < len(hit["example"]["message"]):
                        hit["example"] = f
            if time.time() - last_log > 30:
                last_log = time.time()
                log(f"[{time.time() - t0:7.0f} s] {target}/{backend}: {tot['cases']} cases"
                    + (f", {tot['grammar']['docs']} documents" if target == "grammar" else "")
                    + f", {sum(h['count'] for h in shapes.values())} findings ({len(shapes)} shapes)")
    wall = time.time() - t0
    written = []
    if shapes:
        out_dir = Path(findings_dir or Path(tempfile.gettempdir()) / "needle_cy_fuzz_findings")
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, (key, hit) in enumerate(sorted(shapes.items())):
            ex = dict(hit["example"], target=target, backend=backend, count=hit["count"])
            path = out_dir / f"{target}-{backend}-{ex['seed']}-{ex['index']}.json"
            ex["replay"] = f"python tests/fuzz_harness.py --replay {path}"
            path.write_text(json.dumps(ex, indent=1, ensure_ascii=True))
            written.append(str(path))
    return {"target": target, "backend": backend, "seeds": list(seeds), "per_seed_cases": per_seed,
            "workers": workers, "wall_s": round(wall, 1), "budget_hit": time.time() >= deadline,
            "cases": tot["cases"], "counts": tot["counts"], "grammar": tot["grammar"], "compile_errors": tot["errors"],
            "findings": sum(h["count"] for h in shapes.values()), "shapes": {k: h["count"] for k, h in shapes.items()},
            "reproducers": written, "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def replay(path):
    """Run a reproducer file's case again; returns its outcome (raises what the case raises)."""
    rec = json.loads(Path(path).read_text())
    data = bytes.fromhex(rec["data_hex"])
    if rec["target"] == "grammar":
        print("schema:", json.dumps(gen_root(Src(data))))
        return grammar_target(data, backend=rec.get("backend", "cython")).line()
    return TARGETS[rec["target"]](data)


def _parse_seeds(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", choices=sorted(TARGETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000, help="inputs (non-grammar targets)")
    ap.add_argument("--docs", type=int, default=0, help="grammar: run until this many documents")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided with atheris; rest to libFuzzer")
    ap.add_argument("--campaign", action="store_true",
                    help="parallel campaign over --seeds until --docs (grammar) / --cases or --budget-s")
    ap.add_argument("--seeds", default="", help="campaign seeds: 'A-B,C'")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=3600.0)
    ap.add_argument("--backend", choices=["cython", "python"], default="cython",
                    help="grammar: the runtime every document runs on (the other checks every 4th)")
    ap.add_argument("--findings", default=None, help="reproducer folder (default: <tmp>/needle_cy_fuzz_findings)")
    ap.add_argument("--record", default=None, help="campaign: write the summary (JSON) here")
    ap.add_argument("--replay", default=None, help="run a reproducer file again")
    args, rest = ap.parse_known_args(argv)
    if args.replay:
        print(replay(args.replay))
        return 0
    if args.target is None:
        ap.error("a target is required")
    if args.campaign:
        seeds = _parse_seeds(args.seeds) if args.seeds else [args.seed]
        goal = args.docs if args.target == "grammar" else args.cases
        if args.target == "grammar" and not goal:
            ap.error("--campaign grammar needs --docs")
        summary = campaign(args.target, seeds, goal, args.workers, args.budget_s, args.backend, args.findings,
                           log=lambda m: print(m, flush=True))
        print(json.dumps({k: v for k, v in summary.items() if k != "per_seed_cases"}, indent=1))
        if args.record:
            Path(args.record).write_text(json.dumps(summary, indent=1))
        return 1 if summary["findings"] else 0
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
