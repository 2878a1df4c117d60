"""Tokenizer: record parsing/validation, spec §6.2 encoding rules, decoding, piece tables.

Differential fuzzing against sentencepiece / HF tokenizers lives in test_tokenizer_fuzz.py;
the official fixture ids in conformance/test_fixture_tokenizer.py.
"""
import math
import random
import struct

import pytest
from conftest import FIXTURE_MODELS, fixture_path
from tokenizer_helpers import (BYTE, CONTROL, USER_DEFINED, archive_tokenizer_bytes, toy_record,
                               toy_tokenizer)

from needle_cy.errors import TokenizerError
from needle_cy.reference import bpe as ref
from needle_cy.tokenizer import (CHAT_MARKERS, Tokenizer, UnknownMarkerError,
                                 parse_tokenizer_record, record_from_sentencepiece)


@pytest.fixture(scope="module")
def record_bytes():
    return archive_tokenizer_bytes(fixture_path("needle3_tiny_a", "model.cact"))


@pytest.fixture(scope="module")
def tok(record_bytes):
    return Tokenizer.from_record_bytes(record_bytes)


# ---------------------------------------------------------------------------- parsing
def test_fixture_record_fields(tok):
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 2048
    assert tok.add_dummy_prefix and tok.record.byte_fallback
    # spec §6.1: the ten chat markers with fixed ids, the rest looked up by surface
    for marker_id, marker in enumerate(CHAT_MARKERS[:10], start=4):
        assert tok.marker_id(marker) == marker_id
    assert set(tok.markers) == set(CHAT_MARKERS)
    assert sum(t == BYTE for t in tok.record.types) == 256


def test_record_roundtrips_bytes(record_bytes):
    assert parse_tokenizer_record(record_bytes).to_bytes() == record_bytes


@pytest.mark.parametrize("model", FIXTURE_MODELS)
def test_record_from_sentencepiece_equals_official_dump(model):
    pytest.importorskip("sentencepiece")
    official = archive_tokenizer_bytes(fixture_path(model, "model.cact"))
    assert record_from_sentencepiece(fixture_path(model, "tokenizer.model")) == official


def test_from_archive_path_and_archive():
    from needle_cy.archive import Archive

    path = fixture_path("needle3_tiny_b", "model.cact")
    by_path = Tokenizer.from_archive(path)
    by_archive = Tokenizer.from_archive(Archive.open(path))
    text = "<|im_start|>user\nturn on the lights<|im_end|>"
    assert (by_path.encode(text, allowed_special="all") == by_archive.encode(text, allowed_special="all")
            == ref.encode(text, by_path.record))


def _header(n_pieces=1, pad=0, eos=0, bos=0, unk=0, dummy=1, fallback=1, zero=0):
    return struct.pack("<5IBBH", n_pieces, pad, eos, bos, unk, dummy, fallback, zero)


def _piece(surface, score=0.0, piece_type=0, length=None):
    raw = surface if isinstance(surface, bytes) else surface.encode()
    return struct.pack("<fBH", score, piece_type, len(raw) if length is None else length) + raw


MALFORMED = {
    "empty": b"",
    "truncated header": _header()[:20],
    "no pieces": _header(n_pieces=0),
    "n_pieces beyond data": _header(n_pieces=3) + _piece("a"),
    "huge n_pieces": _header(n_pieces=0xFFFFFFFF) + _piece("a"),
    "truncated piece header": _header(n_pieces=2) + _piece("a") + _piece("b")[:5] + b"\0\0\0\0\0\0\0",
    "surface overrun": _header(n_pieces=1) + _piece("abc", length=9),
    "bad type": _header(n_pieces=1) + _piece("a", piece_type=5),
    "bad utf-8": _header(n_pieces=1) + _piece(b"\xff\xfe"),
    "utf-8 surrogate": _header(n_pieces=1) + _piece(b"\xed\xa0\x80"),
    "empty surface": _header(n_pieces=1) + _piece(""),
    "nan score": _header(n_pieces=1) + _piece("a", score=math.nan),
    "flag not 0/1": _header(n_pieces=1, dummy=2) + _piece("a"),
    "nonzero padding": _header(n_pieces=1, zero=7) + _piece("a"),
    "unk out of range": _header(n_pieces=1, unk=1) + _piece("a"),
    "bos out of range": _header(n_pieces=1, bos=9) + _piece("a"),
    "bad byte surface": _header(n_pieces=1) + _piece("<0xZZ>", piece_type=BYTE),
    "trailing bytes": _header(n_pieces=1) + _piece("a") + b"\0",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_record_raises(name):
    with pytest.raises(TokenizerError):
        Tokenizer.from_record_bytes(MALFORMED[name])


def test_n_pieces_above_vocab_raises(record_bytes):
    with pytest.raises(TokenizerError, match="vocab"):
        Tokenizer.from_record_bytes(record_bytes, vocab=2047)
    assert Tokenizer.from_record_bytes(record_bytes, vocab=2080).vocab_size == 2048


def test_truncation_anywhere_raises(record_bytes):
    rng = random.Random(0)
    for cut in [0, 5, 23, 24, 25, 30] + rng.sample(range(31, len(record_bytes)), 40):
        with pytest.raises(TokenizerError):
            parse_tokenizer_record(record_bytes[:cut])


# ---------------------------------------------------------------------------- spec §6.2 rules
WORKED = [("▁", 1.0), ("a", 0.5), ("▁a", 2.0), ("<|im_start|>", 0.0, USER_DEFINED)]


def test_spec_worked_example():
    tok = toy_tokenizer(WORKED)
    ids = tok.encode("<|im_start|>a a", allowed_special="all")
    p = tok.record.pieces
    assert [p[i] for i in ids] == ["▁", "<|im_start|>", "a", "▁a"]
    assert tok.decode(ids) == "<|im_start|>a a"
    assert ids == ref.encode("<|im_start|>a a", tok.record)


def test_empty_and_dummy_prefix_switch():
    tok = toy_tokenizer(WORKED)
    assert tok.encode("") == [] == tok.encode("", dummy_prefix=False)
    p = tok.record.pieces
    assert [p[i] for i in tok.encode("a")] == ["▁a"]
    assert [p[i] for i in tok.encode("a", dummy_prefix=False)] == ["a"]
    no_prefix = toy_tokenizer(WORKED, add_dummy_prefix=False)
    assert [no_prefix.record.pieces[i] for i in no_prefix.encode("a")] == ["a"]
    assert no_prefix.decode(no_prefix.encode(" a")) == " a"  # no space dropped without the flag


def test_ties_go_to_leftmost_pair():
    # "ab" and "bc" have equal scores: in "abc" the leftmost pair (a,b) merges first.
    tok = toy_tokenizer([("a", -5), ("b", -5), ("c", -5), ("ab", 1.0), ("bc", 1.0)], add_dummy_prefix=False)
    assert [tok.record.pieces[i] for i in tok.encode("abc")] == ["ab", "c"]
    # a higher score on the right wins regardless of position
    tok = toy_tokenizer([("a", -5), ("b", -5), ("c", -5), ("ab", 1.0), ("bc", 1.5)], add_dummy_prefix=False)
    assert [tok.record.pieces[i] for i in tok.encode("abc")] == ["a", "bc"]


def test_markers_longest_first_then_id_order():
    pieces = [("<a>", 0.0, USER_DEFINED), ("<a><b>", 0.0, USER_DEFINED), ("<b>", 0.0, USER_DEFINED)]
    tok = toy_tokenizer(pieces, add_dummy_prefix=False)
    assert [tok.record.pieces[i] for i in tok.encode("<a><b><b>", allowed_special="all")] == ["<a><b>", "<b>"]
    # equal length, overlapping candidates at the same position cannot both match; check the
    # id-order tie on identical surfaces instead: the lower id fires
    dup = toy_tokenizer([("<m>", 0.0, USER_DEFINED), ("<m>", 0.0, USER_DEFINED)], add_dummy_prefix=False)
    assert dup.encode("<m>", allowed_special="all") == [260]
    assert dup.encode("<m>", allowed_special="all") == ref.encode("<m>", dup.record)


def test_markers_are_never_split_and_flush_the_buffer():
    tok = toy_tokenizer([("x", -1.0), ("y", -1.0), ("<", -1.0), (">", -1.0), ("x<", 5.0),
                         ("<t>", 0.0, USER_DEFINED), (">y", 5.0)], add_dummy_prefix=False)
    # "x<" would be a high-scoring merge, but the marker is cut out first
    assert [tok.record.pieces[i] for i in tok.encode("x<t>y", allowed_special="all")] == ["x", "<t>", "y"]


def test_merges_may_form_control_or_byte_surfaces():
    # spec §6.2: the surface lookup covers every piece type (bit-compatible edge case)
    tok = toy_tokenizer([("<", -1.0), ("s", -1.0), (">", -1.0), ("<s", 1.0)], add_dummy_prefix=False)
    assert tok.encode("<s>", allowed_special="all") == [2]  # the CONTROL piece <s>
    assert tok.encode("<s>", allowed_special="all") == ref.encode("<s>", tok.record)
    # as text (the default) it stays text: "<s" + ">"
    assert [tok.record.pieces[i] for i in tok.encode("<s>")] == ["<s", ">"]


def test_duplicate_surface_highest_id_wins():
    tok = toy_tokenizer([("a", -1.0), ("b", -1.0), ("ab", 1.0), ("ab", 0.5)], add_dummy_prefix=False)
    assert tok.encode("ab") == [263] == ref.encode("ab", tok.record)


def test_byte_fallback_and_unk():
    tok = toy_tokenizer([("a", -1.0)], add_dummy_prefix=False)
    # é = C3 A9: two byte pieces at ids 4 + byte value
    assert tok.encode("aé") == [260, 4 + 0xC3, 4 + 0xA9]
    assert tok.decode(tok.encode("aé😀")) == "aé😀"
    no_fallback = toy_tokenizer([("a", -1.0)], add_dummy_prefix=False, byte_fallback=False)
    assert no_fallback.encode("aé") == [4 + 256, 3]
    # a byte piece missing from the vocabulary → unk for that byte (spec §6.2 step 7)
    record = toy_record([("a", -1.0)], add_dummy_prefix=False)
    pieces = list(record.pieces)
    pieces[4 + 0xA9] = "<0xA9>"  # keep it, but drop 0xC3 by retyping it as a normal piece
    types = list(record.types)
    types[4 + 0xC3] = 0
    pieces[4 + 0xC3] = "not-a-byte"
    holey = Tokenizer(record.__class__(tuple(pieces), record.scores, tuple(types), 0, 1, 2, 3, False, True))
    assert holey.encode("é") == [3, 4 + 0xA9] == ref.encode("é", holey.record)


def test_no_bytes_pieces_at_all():
    tok = toy_tokenizer([("a", -1.0)], add_dummy_prefix=False, with_bytes=False)
    assert tok.encode("aé") == [4, 3, 3]  # two missing bytes → two unk
    assert tok.encode("aé") == ref.encode("aé", tok.record)


def test_inner_meta_space_disables_chunking_but_not_results():
    pieces = [("▁", -3), ("a", -3), ("b", -3), ("a▁", 2.0), ("▁b", 1.0), ("a▁b", 3.0)]
    tok = toy_tokenizer(pieces, add_dummy_prefix=False)
    assert not tok._encoder.split_before_space
    assert [tok.record.pieces[i] for i in tok.encode("a b")] == ["a▁b"]
    assert tok.encode("xa ba b a") == ref.encode("xa ba b a", tok.record)
    chunky = toy_tokenizer([("▁", -3), ("a", -3), ("▁a", 1.0)])
    assert chunky._encoder.split_before_space


def test_tabs_newlines_and_other_spaces_are_not_normalized(tok):
    for text in ["a\tb", "a\nb", "a\u00a0b", "a\u3000b", "a\r\nb", "  x  "]:
        ids = tok.encode(text)
        assert ids == ref.encode(text, tok.record)
        assert tok.decode(ids) == text


def test_lone_surrogate_raises(tok):
    with pytest.raises(TokenizerError, match="surrogate"):
        tok.encode("ab\ud800c")
    with pytest.raises(TypeError):
        tok.encode(b"bytes")


def test_continuation_after_marker_is_compositional(tok):
    rng = random.Random(3)
    words = ["turn", "on", " the", "lights", "é", "{\"a\":1}", "\n", " ", "42"]
    for _ in range(200):
        first = "".join(rng.choice(words) for _ in range(rng.randint(0, 5)))
        marker = rng.choice(CHAT_MARKERS)
        rest = "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
        whole = first + marker + rest
        assert (tok.encode(whole, allowed_special="all")
                == tok.encode(first + marker, allowed_special="all") + tok.encode(rest, dummy_prefix=False))


def test_long_no_space_string_matches_reference_on_toy_vocab():
    # deep merge chains over 600 characters (the reference is quadratic, keep it modest)
    pieces = [("a", -10), ("b", -10), ("ab", 1), ("ba", 1), ("aa", 2), ("bb", 0.5),
              ("aab", 3), ("abab", 1), ("bbb", 3)]
    tok = toy_tokenizer(pieces, add_dummy_prefix=False)
    rng = random.Random(5)
    text = "".join(rng.choice("aab") for _ in range(600))
    assert tok.encode(text) == ref.encode(text, tok.record)


def test_random_toy_vocabularies_cython_equals_reference():
    """Random vocabularies with many equal scores, markers, inner "▁" and control pieces."""
    rng = random.Random(11)
    alphabet = ["a", "b", "c", "▁", "é", "😀", "<", ">"]
    for trial in range(150):
        pieces, seen = [], set()
        for char in rng.sample(alphabet, rng.randint(3, len(alphabet))):
            pieces.append((char, float(rng.randint(-3, 0))))
            seen.add(char)
        for _ in range(rng.randint(3, 25)):
            surface = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 4)))
            if surface in seen and rng.random() < 0.8:
                continue
            seen.add(surface)
            roll = rng.random()
            piece_type = USER_DEFINED if roll < 0.08 else CONTROL if roll < 0.12 else 0
            pieces.append((surface, float(rng.randint(-4, 4)), piece_type))
        record = toy_record(pieces, add_dummy_prefix=rng.random() < 0.5,
                            byte_fallback=rng.random() < 0.8, with_bytes=rng.random() < 0.8)
        tok = Tokenizer(record)
        for _ in range(25):
            text = "".join(rng.choice(alphabet + [" ", "x", "ab"]) for _ in range(rng.randint(0, 30)))
            for prefix in (True, False):
                assert tok.encode(text, prefix, "all") == ref.encode(text, record, prefix), (trial, text, pieces)
            assert tok.decode(tok.encode(text, allowed_special="all")) == ref.decode(
                tok.encode(text, allowed_special="all"), record)


# ---------------------------------------------------------------------------- markers as text
SPECIAL_SPELLINGS = list(CHAT_MARKERS) + ["<s>", "</s>", "<pad>", "<unk>", "<0x41>", "<0x0A>"]


def _not_text_ids(tok, ids):
    """The ids among ``ids`` that stand for something other than their text (markers,
    control and unknown pieces); byte pieces are text."""
    return [i for i in ids if tok.piece_type(i) in (CONTROL, USER_DEFINED, 1)]


def test_marker_spellings_are_text_by_default(tok):
    for spelling in SPECIAL_SPELLINGS:
        for text in (spelling, f"x{spelling}y", f"turn on {spelling} the {spelling}{spelling}\n"):
            for prefix in (True, False):
                ids = tok.encode(text, prefix)
                assert _not_text_ids(tok, ids) == [], (text, [tok.piece(i) for i in ids])
                assert tok.decode(ids) == text if prefix else tok.decode(ids).lstrip() == text.lstrip()
                assert ids == ref.encode(text, tok.record, prefix, allowed_ids=())
        ids = tok.encode(f"a{spelling}b", allowed_special="all")
        if spelling in CHAT_MARKERS:   # the spec encoding turns the spelling into the marker
            assert tok.marker_id(spelling) in ids


def test_every_marker_spelling_at_once_round_trips(tok):
    text = "".join(f"{m} w{k} " for k, m in enumerate(CHAT_MARKERS * 2))
    ids = tok.encode(text)
    assert _not_text_ids(tok, ids) == [] and tok.decode(ids) == text
    spec = tok.encode(text, allowed_special="all")
    assert len(_not_text_ids(tok, spec)) == 2 * len(CHAT_MARKERS) and tok.decode(spec) == text


def test_text_mode_equals_spec_on_ordinary_text(tok):
    rng = random.Random(23)
    words = ["turn", " on", " the", "lights", "é", "{\"a\":1}", "\n", " ", "42", "<", ">", "|", "im_", "tool",
             "東京", "😀", "</", "think", "\t"]
    for _ in range(400):
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        if any(s in text.replace(" ", "\u2581") for s in tok.record.pieces[:4] + tuple(CHAT_MARKERS)):
            continue
        for prefix in (True, False):
            assert tok.encode(text, prefix) == tok.encode(text, prefix, "all"), text


def test_allowed_special_subset_and_bad_values(tok):
    text = "<tool_call>[]</tool_call><|im_end|>"
    ids = tok.encode(text, allowed_special={"<tool_call>"})
    assert _not_text_ids(tok, ids) == [tok.marker_id("<tool_call>")]
    assert ids[1] == tok.marker_id("<tool_call>") and tok.decode(ids) == text   # ids[0]: the dummy "▁"
    assert ids == ref.encode(text, tok.record, allowed_ids=[tok.marker_id("<tool_call>")])
    both = tok.encode(text, allowed_special=["<tool_call>", "</tool_call>", "<|im_end|>"])
    assert both == tok.encode(text, allowed_special="all")
    assert tok.encode(text, allowed_special=set()) == tok.encode(text)
    with pytest.raises(ValueError, match="'all' or a set"):
        tok.encode(text, allowed_special="<tool_call>")
    with pytest.raises(UnknownMarkerError, match="<nope>"):
        tok.encode(text, allowed_special={"<nope>"})
    with pytest.raises(UnknownMarkerError):
        tok.encode(text, allowed_special={"<s>"})     # a control piece is never allowed
    with pytest.raises(TypeError, match="int"):
        tok.encode(text, allowed_special={4})
    with pytest.raises(TypeError, match="allowed_special"):
        tok.encode(text, allowed_special=4)


def test_text_mode_keeps_merges_through_a_one_character_marker():
    # "§" is a marker of its own and a prefix of the normal piece "§a": as text, "§a" merges
    tok = toy_tokenizer([("a", -1.0), ("§", 0.0, USER_DEFINED), ("§a", 5.0), ("<", 0.0, CONTROL), ("<b", 3.0),
                         ("b", -1.0)], add_dummy_prefix=False)
    p = tok.record.pieces
    assert [p[i] for i in tok.encode("§a§")] == ["§a", "<0xC2>", "<0xA7>"]
    assert [p[i] for i in tok.encode("§a§", allowed_special="all")] == ["§", "a", "§"]
    assert [p[i] for i in tok.encode("<b<")] == ["<b", "<0x3C>"]
    for text in ("§a§", "<b<", "a§§a<<b"):
        assert tok.encode(text) == ref.encode(text, tok.record, allowed_ids=())
        assert tok.decode(tok.encode(text)) == text


def test_random_toy_vocabularies_text_mode_equals_reference():
    """Text mode against the reference twin, on random vocabularies whose markers and
    control pieces (one character or several) overlap the normal pieces."""
    rng = random.Random(29)
    alphabet = ["a", "b", "c", "▁", "é", "😀", "<", ">"]
    for trial in range(150):
        pieces, seen = [], set()
        for char in rng.sample(alphabet, rng.randint(3, len(alphabet))):
            roll = rng.random()
            kind = USER_DEFINED if roll < 0.1 else CONTROL if roll < 0.15 else 0
            pieces.append((char, float(rng.randint(-3, 0)), kind))
            seen.add(char)
        for _ in range(rng.randint(3, 25)):
            surface = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 4)))
            if surface in seen and rng.random() < 0.8:
                continue
            seen.add(surface)
            roll = rng.random()
            piece_type = USER_DEFINED if roll < 0.15 else CONTROL if roll < 0.2 else 0
            pieces.append((surface, float(rng.randint(-4, 4)), piece_type))
        fallback = rng.random() < 0.8
        record = toy_record(pieces, add_dummy_prefix=rng.random() < 0.5, byte_fallback=fallback)
        tok = Tokenizer(record)
        markers = sorted(tok.markers)
        for _ in range(25):
            text = "".join(rng.choice(alphabet + [" ", "x", "ab"] + markers) for _ in range(rng.randint(0, 30)))
            allowed = rng.sample(markers, rng.randint(0, len(markers))) if rng.random() < 0.3 else []
            allowed_ids = [tok.marker_id(m) for m in allowed]
            for prefix in (True, False):
                ids = tok.encode(text, prefix, set(allowed))
                assert ids == ref.encode(text, record, prefix, allowed_ids=allowed_ids), (trial, text, pieces)
                assert all(i in allowed_ids or tok.piece_type(i) not in (CONTROL, USER_DEFINED) for i in ids)
            if fallback and "▁" not in text:
                assert tok.decode(tok.encode(text)).lstrip(" ") == text.lstrip(" "), (trial, text)


# ---------------------------------------------------------------------------- decoding
def test_decode_rules(tok):
    b = tok.byte_ids()
    # a 3-byte character split over byte pieces decodes once joined
    assert tok.decode([b[0xE2], b[0x82], b[0xAC]]) == "€"
    # an invalid sequence becomes U+FFFD; control/unknown are skipped; markers are kept
    assert tok.decode([b[0xFF], tok.bos_id, tok.unk_id, tok.eos_id]) == "\ufffd"
    assert tok.decode([tok.marker_id("<tool_call>")]) == "<tool_call>"
    # exactly one leading space is dropped
    meta = tok.encode(" ")  # "▁▁" → two ▁ pieces
    assert tok.decode(meta) == " " and tok.decode(meta + meta) == "   "
    with pytest.raises(TokenizerError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    assert tok.decode([]) == ""


def test_stream_decoder_matches_decode(tok):
    rng = random.Random(7)
    b = tok.byte_ids()
    stream = tok.stream_decoder()
    assert stream.push(b[0xE2]) == "" and stream.push(b[0x82]) == "" and stream.push(b[0xAC]) == "€"
    assert stream.flush() == ""
    for _ in range(300):
        if rng.random() < 0.5:
            ids = tok.encode("".join(rng.choice(["é", " ", "😀", "ab", "東京", "\n", "▁"])
                                     for _ in range(rng.randint(0, 12))))
        else:
            ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 20))]
        stream = tok.stream_decoder()
        pieces = [stream.push(i) for i in ids]
        assert "".join(pieces) + stream.flush() == tok.decode(ids)
        for piece in pieces:  # never half a character
            assert "\ufffd" not in piece or "\ufffd" in tok.decode(ids)


def test_piece_bytes_and_table(tok):
    table = tok.piece_table()
    assert len(table) == tok.vocab_size
    b = tok.byte_ids()
    assert table[b[0x41]] == b"A" and tok.piece_bytes(b[0xC3]) == b"\xc3"
    for special in (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id):
        assert table[special] is None and tok.piece_bytes(special) == b""
    for marker in CHAT_MARKERS:
        assert table[tok.marker_id(marker)] is None
        assert tok.piece_bytes(tok.marker_id(marker)) == marker.encode()
    meta_ids = [i for i, p in enumerate(tok.record.pieces) if p.startswith("▁") and len(p) > 1]
    assert meta_ids and all(table[i] == b" " + tok.record.pieces[i][1:].encode() for i in meta_ids)
    # every normal token's table entry equals what decode produces after some prefix
    for i in range(tok.vocab_size):
        if table[i] is not None and tok.record.types[i] == 0:
            assert tok.decode([tok.marker_id("<tool_call>"), i]).encode() == b"<tool_call>" + table[i]
    wide = tok.piece_table(size=2080)
    assert len(wide) == 2080 and wide[:2048] == table and all(x is None for x in wide[2048:])
    assert tok.piece_table(size=10) == table[:10]
    with pytest.raises(TokenizerError):
        tok.piece_bytes(5000)


def test_marker_id_unknown(tok):
    with pytest.raises(UnknownMarkerError) as info:
        tok.marker_id("<nope>")
    assert isinstance(info.value, KeyError) and isinstance(info.value, TokenizerError)
    assert "<nope>" in str(info.value) and "<tool_call>" in str(info.value)
    with pytest.raises(KeyError):
        tok.marker_id("a")  # a normal piece is not a marker


def test_mutated_records_fail_cleanly_or_encode_like_reference(record_bytes):
    """Random byte flips: either a TokenizerError or a vocabulary the encoder handles like the reference."""
    rng = random.Random(17)
    accepted = 0
    for _ in range(60):
        data = bytearray(record_bytes)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            tok = Tokenizer.from_record_bytes(bytes(data))
        except TokenizerError:
            continue
        accepted += 1
        for text in ("<|im_start|>user\nturn on the lights<|im_end|>", "é 😀 {\"a\":[1,2]}"):
            assert tok.encode(text, allowed_special="all") == ref.encode(text, tok.record)
            assert tok.encode(text) == ref.encode(text, tok.record, allowed_ids=())
    assert accepted > 5  # flips inside surfaces/scores usually leave a valid record
