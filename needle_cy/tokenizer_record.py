"""The tokenizer record of a ``.cact`` archive (spec §2.9): its layout, parsed and validated.

Shared by ``needle_cy.archive`` (which validates the record when an archive is opened) and
``needle_cy.tokenizer`` (which builds the encoder from it); neither imports the other for it.
"""
import math
import re
import struct
from dataclasses import dataclass

from .errors import TokenizerError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 3, 4
TYPE_NAMES = {NORMAL: "NORMAL", UNKNOWN: "UNKNOWN", CONTROL: "CONTROL",
              USER_DEFINED: "USER_DEFINED", BYTE: "BYTE"}

_HEADER = struct.Struct("<5IBBH")   # n_pieces, pad, eos, bos, unk, add_dummy_prefix, byte_fallback, zero
_PIECE = struct.Struct("<fBH")      # score, type, surface_len (then the surface bytes)
_BYTE_SURFACE = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")


@dataclass(frozen=True)
class TokenizerRecord:
    """The parsed tokenizer record: one entry per piece, in id order, plus the header fields."""

    pieces: tuple       # surfaces (str)
    scores: tuple       # float32 values as Python floats
    types: tuple        # 0 NORMAL, 1 UNKNOWN, 2 CONTROL, 3 USER_DEFINED, 4 BYTE
    pad_id: int
    eos_id: int
    bos_id: int
    unk_id: int
    add_dummy_prefix: bool
    byte_fallback: bool

    @property
    def n_pieces(self):
        return len(self.pieces)

    def to_bytes(self):
        """The record's exact on-disk encoding (inverse of ``parse_tokenizer_record``)."""
        out = [_HEADER.pack(len(self.pieces), self.pad_id, self.eos_id, self.bos_id, self.unk_id,
                            int(self.add_dummy_prefix), int(self.byte_fallback), 0)]
        for surface, score, piece_type in zip(self.pieces, self.scores, self.types):
            raw = surface.encode("utf-8")
            out.append(_PIECE.pack(score, piece_type, len(raw)))
            out.append(raw)
        return b"".join(out)


def parse_tokenizer_record(data, vocab=None):
    """Parse and validate a RAW tokenizer record (spec §2.9); ``vocab`` = embedding rows V if known.

    Raises TokenizerError naming the field, the byte offset and what was expected.
    """
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise TokenizerError(f"tokenizer record truncated: {len(data)} bytes, "
                             f"expected at least the {_HEADER.size}-byte header")
    n_pieces, pad_id, eos_id, bos_id, unk_id, dummy, fallback, zero = _HEADER.unpack_from(data, 0)
    if n_pieces == 0:
        raise TokenizerError("tokenizer record has n_pieces = 0, expected at least one piece")
    if vocab is not None and n_pieces > vocab:
        raise TokenizerError(f"tokenizer record has n_pieces = {n_pieces}, more than the "
                             f"archive's vocab = {vocab} embedding rows")
    # Every piece takes at least 7 bytes: reject absurd counts before allocating anything.
    if n_pieces > (len(data) - _HEADER.size) // _PIECE.size:
        raise TokenizerError(f"tokenizer record truncated: n_pieces = {n_pieces} needs at least "
                             f"{_HEADER.size + n_pieces * _PIECE.size} bytes, the record has {len(data)}")
    for name, value in (("add_dummy_prefix", dummy), ("byte_fallback", fallback)):
        if value not in (0, 1):
            raise TokenizerError(f"tokenizer record header field {name} = {value}, expected 0 or 1")
    if zero != 0:
        raise TokenizerError(f"tokenizer record header padding (offset 22) = {zero}, expected 0")
    for name, value in (("pad_id", pad_id), ("eos_id", eos_id), ("bos_id", bos_id), ("unk_id", unk_id)):
        if value >= n_pieces:
            raise TokenizerError(f"tokenizer record header {name} = {value}, expected < n_pieces = {n_pieces}")

    pieces, scores, types = [], [], []
    offset = _HEADER.size
    for piece_id in range(n_pieces):
        if offset + _PIECE.size > len(data):
            raise TokenizerError(f"tokenizer record truncated in piece {piece_id} at byte {offset}: "
                                 f"expected a {_PIECE.size}-byte piece header, {len(data) - offset} bytes left")
        score, piece_type, surface_len = _PIECE.unpack_from(data, offset)
        offset += _PIECE.size
        if piece_type not in TYPE_NAMES:
            raise TokenizerError(f"tokenizer piece {piece_id} (byte {offset - _PIECE.size}) has type "
                                 f"{piece_type}, expected 0..4 (NORMAL/UNKNOWN/CONTROL/USER_DEFINED/BYTE)")
        if math.isnan(score):
            raise TokenizerError(f"tokenizer piece {piece_id} has a NaN score, expected a number")
        if surface_len == 0:
            raise TokenizerError(f"tokenizer piece {piece_id} has an empty surface, expected 1+ bytes")
        if offset + surface_len > len(data):
            raise TokenizerError(f"tokenizer piece {piece_id} surface overruns the record: "
                                 f"{surface_len} bytes at byte {offset}, record ends at {len(data)}")
        try:
            surface = data[offset:offset + surface_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerError(f"tokenizer piece {piece_id} surface (byte {offset}) is not valid "
                                 f"UTF-8: {exc.reason} at surface byte {exc.start}") from None
        if any(0xD800 <= ord(c) <= 0xDFFF for c in surface):  # pragma: no cover - strict UTF-8 forbids
            raise TokenizerError(f"tokenizer piece {piece_id} surface contains a surrogate")
        if piece_type == BYTE and not _BYTE_SURFACE.match(surface):
            raise TokenizerError(f"tokenizer piece {piece_id} has type BYTE but surface {surface!r}, "
                                 "expected <0xHH>")
        offset += surface_len
        pieces.append(surface)
        scores.append(score)
        types.append(piece_type)
    if offset != len(data):
        raise TokenizerError(f"tokenizer record has {len(data) - offset} trailing bytes after "
                             f"piece {n_pieces - 1} (record ends at byte {offset} of {len(data)})")
    return TokenizerRecord(tuple(pieces), tuple(scores), tuple(types), pad_id, eos_id, bos_id, unk_id,
                           bool(dummy), bool(fallback))
