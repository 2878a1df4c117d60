"""Helpers shared by the tokenizer tests: fixture records and toy vocabularies."""
import struct

from needle_cy.tokenizer import (BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, Tokenizer,
                                 TokenizerRecord)


def archive_tokenizer_bytes(path):
    """The RAW tokenizer record of a .cact archive."""
    from needle_cy.archive import Archive

    return Archive.open(path).tokenizer_bytes


def toy_record(pieces, add_dummy_prefix=True, byte_fallback=True, with_bytes=True):
    """A record with <pad> </s> <s> <unk> at 0..3, optionally the 256 byte pieces, then ``pieces``.

    ``pieces``: (surface, score) or (surface, score, type) tuples.
    """
    surfaces = ["<pad>", "</s>", "<s>", "<unk>"]
    scores = [0.0, 0.0, 0.0, 0.0]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN]
    if with_bytes:
        for value in range(256):
            surfaces.append(f"<0x{value:02X}>")
            scores.append(0.0)
            types.append(BYTE)
    for entry in pieces:
        surface, score = entry[0], entry[1]
        surfaces.append(surface)
        scores.append(float(struct.unpack("<f", struct.pack("<f", score))[0]))
        types.append(entry[2] if len(entry) > 2 else NORMAL)
    return TokenizerRecord(tuple(surfaces), tuple(scores), tuple(types), 0, 1, 2, 3,
                           add_dummy_prefix, byte_fallback)


def toy_tokenizer(pieces, **kwargs):
    return Tokenizer(toy_record(pieces, **kwargs))


__all__ = ["archive_tokenizer_bytes", "toy_record", "toy_tokenizer", "NORMAL", "UNKNOWN",
           "CONTROL", "USER_DEFINED", "BYTE"]
