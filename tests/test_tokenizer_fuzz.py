"""Differential fuzzing of the encoder on the fixture vocabulary.

* needle_cy ≡ the ``sentencepiece`` library on the fixture's tokenizer.model (≥ 10,000 strings);
* needle_cy ≡ HF ``tokenizers`` configured to the same model (see ``hf_tokenizer`` for how, and
  for the one thing HF cannot express);
* needle_cy (Cython) ≡ needle_cy.reference.bpe (pure Python, on the shorter strings);
* decode(encode(s)) == s.
"""
import json
import random
import re

import pytest
from conftest import fixture_path
from tokenizer_helpers import archive_tokenizer_bytes, toy_record

from needle_cy.reference import bpe as ref
from needle_cy.tokenizer import CHAT_MARKERS, META_SPACE, USER_DEFINED, Tokenizer

N_STRINGS = 10_500

SCRIPTS = [  # (first, last) code point ranges
    (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
    (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F),
    (0x20A0, 0x20CF), (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2500, 0x257F), (0x3000, 0x303F),
    (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFB00, 0xFFFD),
    (0x1F300, 0x1FAFF), (0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0xF0000, 0xF00FF),
]
WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u200b", "\x0b", "\x0c"]
EMOJI = ["😀", "👍🏽", "👩‍💻", "🏳️‍🌈", "❤️", "🇫🇷", "🔥", "🌡️", "☕", "✅", "1️⃣", "🫠"]
WORDS = ("the lights kitchen living room turn on off set thermostat temperature degrees timer minutes "
         "remind me to call mom weather tomorrow Paris München São Paulo naïve café 東京 서울 Москва "
         "name arguments description parameters properties required type string integer enum").split()


def _random_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(SCRIPTS)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def _combining(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        out.append(rng.choice("aeiouAEOnyzçą") + "".join(chr(rng.randint(0x300, 0x36F))
                                                          for _ in range(rng.randint(0, 3))))
    return "".join(out)


def _json_value(rng, depth=0):
    roll = rng.random()
    if depth > 2 or roll < 0.3:
        return rng.choice([
            rng.randint(-10 ** 12, 10 ** 12), rng.random() * 10 ** rng.randint(-5, 9), True, False, None,
            rng.choice(WORDS) + rng.choice(["", "\n", "\t", "\"quoted\"", "\\path", " é ", "😀", "\u0001"]),
        ])
    if roll < 0.65:
        return {rng.choice(WORDS) + str(rng.randint(0, 9)): _json_value(rng, depth + 1)
                for _ in range(rng.randint(0, 4))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def _json(rng):
    compact = rng.random() < 0.6
    return json.dumps(_json_value(rng), ensure_ascii=rng.random() < 0.5,
                      separators=(",", ":") if compact else (", ", ": "))


def _number(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 200)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}"
    if kind == 2:
        return f"{rng.uniform(-1, 1):e}"
    if kind == 3:
        return "+1-555-" + str(rng.randint(1000000, 9999999)) + " $" + str(rng.randint(1, 10 ** 6)) + ".99"
    return ",".join(str(rng.randint(-999, 999)) for _ in range(rng.randint(1, 20)))


def _markers_glued(rng, pieces):
    parts = []
    for _ in range(rng.randint(1, 8)):
        roll = rng.random()
        if roll < 0.35:
            parts.append(rng.choice(CHAT_MARKERS))
        elif roll < 0.5:
            marker = rng.choice(CHAT_MARKERS)  # partial or mangled markers
            cut = rng.randint(1, len(marker) - 1)
            parts.append(rng.choice([marker[:cut], marker[cut:], marker.upper(), marker.replace("_", " ")]))
        elif roll < 0.8:
            parts.append(rng.choice(WORDS))
        else:
            parts.append(rng.choice(pieces).replace(META_SPACE, " "))
    return rng.choice(["", " ", "\n"]).join(parts)


def _piece_soup(rng, pieces):
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))).replace(
        META_SPACE, rng.choice([" ", " ", META_SPACE]))


def generate_strings(pieces, n=N_STRINGS, seed=1234):
    """Deterministic stress strings across the categories the issue lists."""
    rng = random.Random(seed)
    normal = [p for p in pieces if not (p.startswith("<") and p.endswith(">"))]
    makers = [
        lambda: _random_unicode(rng, rng.randint(1, 40)),
        lambda: "".join(rng.choice(EMOJI + WORDS + [" "]) for _ in range(rng.randint(1, 10))),
        lambda: _combining(rng),
        lambda: "".join(rng.choice(WHITESPACE + WORDS) for _ in range(rng.randint(1, 15))),
        lambda: _markers_glued(rng, normal),
        lambda: _json(rng),
        lambda: _number(rng),
        lambda: _piece_soup(rng, normal),
        lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25))),
        lambda: "".join(chr(rng.choice([0, 1, 0x7F, 0x80, 0x9F, 0xFEFF, 0xFFFD, 0xFFFE, 0xFFFF, 0x10FFFF,
                                         0x1F, 0x85, 0x2581, 0x20, 0x41]))
                        for _ in range(rng.randint(1, 10))),
    ]
    strings = ["", " ", META_SPACE, "<s>", "<unk>", "<0x41>", "▁▁", " " * 50, "x" * 3000,
               "9" * 5000, "ab" * 2000]
    while len(strings) < n:
        text = rng.choice(makers)()
        if rng.random() < 0.15:  # glue two categories together
            text += rng.choice(makers)()
        strings.append(text)
    return strings


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_record_bytes(archive_tokenizer_bytes(fixture_path("needle3_tiny_a", "model.cact")))


@pytest.fixture(scope="module")
def strings(tok):
    return generate_strings(tok.record.pieces)


@pytest.fixture(scope="module")
def ours(tok, strings):
    return [tok.encode(s, allowed_special="all") for s in strings]


def test_sentencepiece_agrees(tok, strings, ours):
    spm = pytest.importorskip("sentencepiece")
    processor = spm.SentencePieceProcessor(model_file=str(fixture_path("needle3_tiny_a", "tokenizer.model")))
    theirs = processor.encode(strings)
    mismatches = [(s, a, b) for s, a, b in zip(strings, ours, theirs) if a != b]
    assert len(strings) >= 10_000
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_decode_roundtrip(tok, strings, ours):
    checked = 0
    for text, ids in zip(strings, ours):
        if META_SPACE in text:  # a literal "▁" decodes as a space (spec §6.3)
            assert tok.decode(ids) == text.replace(META_SPACE, " ")
        else:
            assert tok.decode(ids) == text
            checked += 1
    assert checked > 9000


def test_text_mode_round_trips_and_agrees_off_markers(tok, strings, ours):
    """The default (markers as text) gives back every string and, where no string holds a
    marker or control spelling, exactly the sentencepiece ids."""
    specials = re.compile("|".join(re.escape(p) for p, t in zip(tok.record.pieces, tok.record.types)
                                   if t in (1, 2, 3, 4)))
    not_text = {i for i, t in enumerate(tok.record.types) if t in (1, 2, 3)}   # unknown, control, marker
    same = 0
    for text, spec_ids in zip(strings, ours):
        ids = tok.encode(text)
        assert not_text.isdisjoint(ids), text
        if META_SPACE not in text:
            assert tok.decode(ids) == text
        if not specials.search(text.replace(" ", META_SPACE)):
            assert ids == spec_ids, text
            same += 1
    assert same > 5000


def test_cython_equals_reference(tok, strings, ours):
    short = [(s, ids) for s, ids in zip(strings, ours) if len(s) <= 100][:1500]
    assert len(short) >= 1500
    for text, ids in short:
        assert ids == ref.encode(text, tok.record), text
        assert ref.decode(ids, tok.record) == tok.decode(ids)
    for text, _ in short[:300]:
        assert tok.encode(text, dummy_prefix=False, allowed_special="all") == ref.encode(text, tok.record,
                                                                                        dummy_prefix=False)


def hf_merges(record):
    """SentencePiece BPE as HF merges: every split (a, b) of a piece into two pieces, best score first.

    SentencePiece merges the adjacent pair whose *concatenation* has the highest score
    (ties: leftmost).  HF BPE merges the pair with the lowest *rank* (ties: leftmost).
    Listing, for each piece in descending score order, every way of splitting it into two
    pieces gives the same choice whenever the competing pairs form different pieces (scores
    differ).  It cannot express one case: two different splits of the *same* piece (equal
    score) competing at once — SentencePiece takes the leftmost, HF the one listed first.
    """
    vocab = {}
    for piece_id, surface in enumerate(record.pieces):
        vocab[surface] = piece_id
    merges = []
    for surface, piece_id in vocab.items():
        for cut in range(1, len(surface)):
            left, right = surface[:cut], surface[cut:]
            if left in vocab and right in vocab:
                merges.append((-record.scores[piece_id], piece_id, cut, left, right))
    merges.sort()
    return vocab, [(m[3], m[4]) for m in merges]


def hf_tokenizer(record):
    """HF ``tokenizers`` set up like the record: BPE(vocab, merges, byte_fallback), spaces → "▁",
    markers as added tokens matched after normalization.

    The dummy prefix cannot be configured faithfully: ``Prepend("▁")`` also rewrites the
    added-token contents (markers stop matching), and ``Metaspace(prepend_scheme="first")`` skips
    the "▁" when the text already starts with one or with a marker.  The caller therefore
    prepends one " " to the input (equivalent to spec §6.2 step 3).
    """
    tokenizers = pytest.importorskip("tokenizers")
    vocab, merges = hf_merges(record)
    model = tokenizers.models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>",
                                  fuse_unk=False)
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = tokenizers.normalizers.Replace(" ", META_SPACE)
    hf.add_tokens([tokenizers.AddedToken(surface, normalized=True, special=False)
                   for surface, piece_type in zip(record.pieces, record.types) if piece_type == USER_DEFINED])
    return hf


def test_hf_tokenizers_agrees(tok, strings, ours):
    hf = hf_tokenizer(tok.record)
    theirs = [e.ids for e in hf.encode_batch([" " + s if s else s for s in strings], add_special_tokens=False)]
    mismatches = [(s, a, b) for s, a, b in zip(strings, ours, theirs) if a != b]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


def test_hf_tokenizers_agrees_on_random_distinct_score_vocabularies():
    """Where HF can express the model (every piece has its own score, as SentencePiece writes it)."""
    rng = random.Random(21)
    for _ in range(150):
        pieces, seen = [(c, -100.0) for c in "abc"], set("abc")
        for _ in range(rng.randint(3, 14)):
            surface = "".join(rng.choice("abc") for _ in range(rng.randint(2, 4)))
            if surface not in seen:
                seen.add(surface)
                pieces.append((surface, -len(pieces) + rng.random()))  # distinct, any length order
        record = toy_record(pieces, add_dummy_prefix=False)
        tok, hf = Tokenizer(record), hf_tokenizer(record)
        texts = ["".join(rng.choice("abc") for _ in range(rng.randint(2, 12))) for _ in range(30)]
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        assert [tok.encode(t) for t in texts] == theirs


def test_hf_merge_ranks_cannot_express_equal_scores():
    """Where HF cannot: two different pieces with the same score.  SentencePiece breaks the tie
    by position (leftmost pair), HF by merge rank (list order), so no merges list reproduces both
    "abc" → [ab, c] and "bcab"-style leftmost choices.  SentencePiece-trained models give every
    piece its own score, so real vocabularies are unaffected."""
    record = toy_record([("a", -9), ("b", -9), ("c", -9), ("bc", 1.0), ("ab", 1.0)], add_dummy_prefix=False)
    tok, hf = Tokenizer(record), hf_tokenizer(record)
    names = lambda ids: [record.pieces[i] for i in ids]  # noqa: E731
    assert names(tok.encode("abc")) == ["ab", "c"] == names(ref.encode("abc", record))
    assert names(hf.encode("abc", add_special_tokens=False).ids) == ["a", "bc"]


def test_long_no_space_string_agrees_with_sentencepiece(tok):
    spm = pytest.importorskip("sentencepiece")
    processor = spm.SentencePieceProcessor(model_file=str(fixture_path("needle3_tiny_a", "tokenizer.model")))
    rng = random.Random(9)
    text = "".join(rng.choice(WORDS) for _ in range(12_000)).replace(" ", "")[:65_536]
    assert len(text) == 65_536
    assert tok.encode(text, allowed_special="all") == processor.encode(text)
    glued = json.dumps([{"name": w, "arguments": {"x": i}} for i, w in enumerate(WORDS)] * 40,
                       separators=(",", ":"))
    assert tok.encode(glued, allowed_special="all") == processor.encode(glued)


def test_concurrent_encodes_match_serial(tok, strings, ours):
    """encode releases the GIL; the encoder's tables are read-only, each call has its own scratch."""
    from concurrent.futures import ThreadPoolExecutor

    sample = strings[:2000]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(lambda t: tok.encode(t, allowed_special="all"), sample)) == ours[:2000]
