"""The archive's SentencePiece BPE tokenizer: record parsing, encoding, decoding, piece bytes.

The RAW tokenizer record (spec §2.9) is parsed and validated by
``needle_cy.tokenizer_record`` (re-exported here); encoding (§6.2)
runs in the Cython priority-queue BPE of ``needle_cy._bpe`` (its literal twin is
``needle_cy.reference.bpe``); decoding (§6.3) and the per-token output bytes the
grammar needs are plain Python over a table built once.

    tok = Tokenizer.from_archive("model.cact")
    ids = [tok.bos_id] + tok.encode(prompt, allowed_special="all")   # a template you wrote
    tok.decode(ids[1:]) == prompt
    tok.encode(request)          # outside text: marker spellings stay text (the default)
"""
from __future__ import annotations

import codecs
import numbers
import os

from .errors import TokenizerError, UnknownMarkerError
from .tokenizer_record import (  # noqa: F401 - re-exported: the record's names live there
    BYTE, CONTROL, NORMAL, TYPE_NAMES, UNKNOWN, USER_DEFINED, TokenizerRecord, parse_tokenizer_record,
)

META_SPACE = "\u2581"

# The 16 chat markers the official exporter types as USER_DEFINED (spec §6.1).
CHAT_MARKERS = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
    "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>",
    "<context>", "</context>", "<extract>", "</extract>", "<schema>", "</schema>",
)


def record_from_sentencepiece(model_path):
    """The RAW tokenizer record (bytes) for a SentencePiece ``.model``, as the official exporter dumps it.

    Needs the ``sentencepiece`` package (training/export time only; encoding never uses it).
    Types: control → CONTROL, unknown → UNKNOWN, byte → BYTE, one of the 16 chat markers
    → USER_DEFINED, anything else → NORMAL (spec §2.9).
    """
    try:
        import sentencepiece
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TokenizerError("record_from_sentencepiece needs the 'sentencepiece' package "
                             "(pip install needle_cy[train])") from exc
    processor = sentencepiece.SentencePieceProcessor(model_file=os.fspath(model_path))
    specials = {"pad_id": processor.pad_id(), "eos_id": processor.eos_id(),
                "bos_id": processor.bos_id(), "unk_id": processor.unk_id()}
    for name, value in specials.items():
        if value < 0:
            raise TokenizerError(f"SentencePiece model {model_path} has no {name[:-3]} piece "
                                 f"({name} = {value}); the Needle record needs all four special ids")
    pieces, scores, types = [], [], []
    markers = set(CHAT_MARKERS)
    for piece_id in range(processor.get_piece_size()):
        surface = processor.id_to_piece(piece_id)
        if processor.is_control(piece_id):
            piece_type = CONTROL
        elif processor.is_unknown(piece_id):
            piece_type = UNKNOWN
        elif processor.is_byte(piece_id):
            piece_type = BYTE
        elif surface in markers:
            piece_type = USER_DEFINED
        else:
            piece_type = NORMAL
        pieces.append(surface)
        scores.append(processor.get_score(piece_id))
        types.append(piece_type)
    first = processor.encode("a", out_type=str)
    add_dummy_prefix = bool(first) and first[0].startswith(META_SPACE)
    record = TokenizerRecord(tuple(pieces), tuple(scores), tuple(types), specials["pad_id"],
                             specials["eos_id"], specials["bos_id"], specials["unk_id"],
                             add_dummy_prefix, True)
    return record.to_bytes()


class StreamDecoder:
    """Incremental ``decode``: ``push(id)`` returns the newly completed characters.

    The concatenation of every ``push`` result and ``flush()`` equals
    ``tokenizer.decode(all pushed ids)``.  Bytes of a character split across
    byte-fallback tokens are held back until the character is complete.
    """

    def __init__(self, tokenizer, drop_dummy_space=None):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending_drop = tokenizer.add_dummy_prefix if drop_dummy_space is None else drop_dummy_space

    def _finish(self, text):
        text = text.replace(META_SPACE, " ")
        if self._pending_drop and text:
            self._pending_drop = False
            if text[0] == " ":
                text = text[1:]
        return text

    def push(self, piece_id: int) -> str:
        return self._finish(self._utf8.decode(self._tokenizer._decode_bytes[self._tokenizer._check_id(piece_id)]))

    def flush(self) -> str:
        """Emit what is left (an incomplete character becomes U+FFFD) and reset."""
        text = self._finish(self._utf8.decode(b"", final=True))
        self._utf8.reset()
        return text


_NO_MARKERS = frozenset()   # encode's default: every marker spelling is text


def _is_id(x):
    """An int-like token id (Python or NumPy integer), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class Tokenizer:
    """Encode/decode with the vocabulary of a Needle archive (spec §6)."""

    def __init__(self, record):
        from . import _bpe  # compiled extension; imported here so parsing works without it

        self.record = record
        self._encoder = _bpe.BPEEncoder(record.pieces, record.scores, record.types, record.unk_id,
                                        record.byte_fallback, self.byte_ids())
        # Bytes each id contributes to decode()'s byte string (before the "▁" → " " step).
        decode_bytes = []
        for surface, piece_type in zip(record.pieces, record.types):
            if piece_type == BYTE:
                decode_bytes.append(bytes([int(surface[3:5], 16)]))
            elif piece_type in (CONTROL, UNKNOWN):
                decode_bytes.append(b"")
            else:
                decode_bytes.append(surface.encode("utf-8"))
        self._decode_bytes = decode_bytes
        self._piece_table = None
        self._markers = {}
        for piece_id, (surface, piece_type) in enumerate(zip(record.pieces, record.types)):
            if piece_type == USER_DEFINED:
                self._markers.setdefault(surface, piece_id)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_record_bytes(cls, data: bytes, vocab: int | None = None) -> "Tokenizer":
        """A tokenizer from RAW record bytes (``vocab``: embedding rows, checked ≥ n_pieces)."""
        return cls(parse_tokenizer_record(data, vocab=vocab))

    @classmethod
    def from_archive(cls, path_or_archive) -> "Tokenizer":
        """The tokenizer attached to a ``.cact`` archive (a path or an opened ``Archive``)."""
        archive = path_or_archive
        if isinstance(path_or_archive, (str, bytes, os.PathLike)):
            from .archive import Archive

            archive = Archive.open(path_or_archive)
        data = archive.tokenizer_bytes
        if data is None:
            raise TokenizerError(f"archive {getattr(archive, 'path', archive)!s} has no tokenizer "
                                 "(no RAW record), expected one as the last record")
        record = getattr(archive, "tokenizer_record", None)
        if record is not None:  # parsed and validated when the archive was opened
            return cls(record)
        vocab = getattr(getattr(archive, "config", None), "vocab", None)
        return cls.from_record_bytes(data, vocab=vocab)

    @classmethod
    def from_sentencepiece(cls, model_path: str | os.PathLike) -> "Tokenizer":
        """A tokenizer from a SentencePiece ``.model`` (needs ``sentencepiece``; export/test time)."""
        return cls.from_record_bytes(record_from_sentencepiece(model_path))

    # -- vocabulary -----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of pieces (may be smaller than the model's embedding rows)."""
        return len(self.record.pieces)

    n_pieces = vocab_size

    @property
    def bos_id(self) -> int:
        return self.record.bos_id

    @property
    def eos_id(self) -> int:
        return self.record.eos_id

    @property
    def pad_id(self) -> int:
        return self.record.pad_id

    @property
    def unk_id(self) -> int:
        return self.record.unk_id

    @property
    def add_dummy_prefix(self) -> bool:
        return self.record.add_dummy_prefix

    @property
    def markers(self):
        """USER_DEFINED surfaces → ids."""
        return dict(self._markers)

    def byte_ids(self):
        """list of 256: id of the ``<0xHH>`` piece of each byte, -1 where the vocabulary lacks it."""
        table = [-1] * 256
        for piece_id, (surface, piece_type) in enumerate(zip(self.record.pieces, self.record.types)):
            if piece_type == BYTE:
                table[int(surface[3:5], 16)] = piece_id
        return table

    def marker_id(self, text: str) -> int:
        """Id of the USER_DEFINED marker ``text`` (e.g. ``"<tool_call>"``)."""
        try:
            return self._markers[text]
        except KeyError:
            raise UnknownMarkerError(f"{text!r} is not a marker of this vocabulary; "
                                     f"markers: {', '.join(sorted(self._markers)) or 'none'}") from None

    def piece(self, piece_id: int) -> str:
        """The stored surface of ``piece_id`` (with "▁", byte pieces as ``<0xHH>``)."""
        return self.record.pieces[self._check_id(piece_id)]

    def piece_type(self, piece_id: int) -> int:
        return self.record.types[self._check_id(piece_id)]

    def _check_id(self, piece_id):
        if not _is_id(piece_id):
            raise TokenizerError(f"token id must be an int, found {type(piece_id).__name__} {piece_id!r}")
        if not (0 <= piece_id < len(self._decode_bytes)):
            raise TokenizerError(f"token id {piece_id} out of range, expected 0 <= id < {len(self._decode_bytes)}")
        return piece_id

    def piece_bytes(self, piece_id: int) -> bytes:
        """Exact output bytes of ``piece_id`` ("▁" → space; control/unknown → b"")."""
        return self._decode_bytes[self._check_id(piece_id)].replace(META_SPACE.encode(), b" ")

    def piece_table(self, size=None):
        """Per-id output bytes for constrained decoding; ``size`` = logits rows (default n_pieces).

        Entry i is ``piece_bytes(i)`` for NORMAL and BYTE pieces, ``None`` for tokens that must
        never appear inside constrained JSON: CONTROL, UNKNOWN, USER_DEFINED markers, ids ≥ n_pieces.
        """
        size = self.vocab_size if size is None else int(size)
        if size < 0:
            raise TokenizerError(f"piece_table size = {size}, expected >= 0")
        if self._piece_table is None:  # built once per vocabulary
            meta = META_SPACE.encode()
            self._piece_table = [
                self._decode_bytes[i].replace(meta, b" ") if piece_type in (NORMAL, BYTE) else None
                for i, piece_type in enumerate(self.record.types)]
        table = self._piece_table[:size]
        table.extend([None] * (size - len(table)))
        return table

    # -- encode / decode ------------------------------------------------------------
    def encode(self, text: str, dummy_prefix: bool = True, allowed_special=_NO_MARKERS) -> list:
        """Ids of ``text`` (no BOS/EOS), spec §6.2.

        ``dummy_prefix=False`` encodes a continuation (spec §7.2): no "▁" is prepended, so
        appending its ids after a marker equals encoding the whole string at once.

        ``allowed_special`` says which chat markers written in ``text`` become marker ids:

        * the default, none: text is text.  A marker's spelling (``"<|im_end|>"``), and
          the surface of a control, unknown or byte piece (``"</s>"``, ``"<0x41>"``), is
          encoded as ordinary pieces (byte fallback where needed), never as that piece's
          id, so ``decode(encode(text)) == text``.  Use it for anything you did not write:
          requests, tool results, tool definitions, system facts.  On text without such
          a spelling the ids are the ones ``"all"`` gives.
        * ``"all"``: spec §6.2 as written, identical to sentencepiece: every marker
          spelling becomes the marker's id.  For a template you wrote yourself.
        * a set of marker spellings: those become ids, every other spelling is text.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        allowed = () if allowed_special is _NO_MARKERS else self._allowed_ids(allowed_special)
        try:
            return self._encoder.encode(text, bool(dummy_prefix and self.record.add_dummy_prefix), allowed)
        except ValueError as exc:  # lone surrogate
            raise TokenizerError(str(exc)) from None

    def _allowed_ids(self, allowed_special):
        """``None`` for "all" (the encoder's spec mode), else the tuple of allowed marker ids."""
        if isinstance(allowed_special, str):
            if allowed_special == "all":
                return None
            raise ValueError(f"allowed_special must be 'all' or a set of marker spellings, got the "
                             f"string {allowed_special!r} (write {{{allowed_special!r}}} for one marker)")
        if not allowed_special:
            return ()
        try:
            spellings = set(allowed_special)
        except TypeError:
            raise TypeError(f"allowed_special must be 'all' or a set of marker spellings, got "
                            f"{type(allowed_special).__name__}") from None
        ids = []
        for spelling in spellings:
            if not isinstance(spelling, str):
                raise TypeError(f"allowed_special holds marker spellings (str), found "
                                f"{type(spelling).__name__} {spelling!r}")
            ids.append(self.marker_id(spelling))
        return tuple(ids)

    def decode(self, ids) -> str:
        """Text of ``ids`` (spec §6.3): control/unknown skipped, bytes joined and UTF-8
        decoded (U+FFFD for invalid sequences), "▁" → " ", one dummy-prefix space dropped."""
        table = self._decode_bytes
        try:
            ids = list(ids)
        except TypeError:
            raise TokenizerError(f"decode expects a sequence of int token ids, found {type(ids).__name__}") from None
        for k, i in enumerate(ids):
            if not _is_id(i):  # a bool (or a float) is not a token id
                raise TokenizerError(f"decode expects int token ids, found {type(i).__name__} {i!r} at index {k}")
        try:
            raw = b"".join([table[i] for i in ids if i >= 0])
            bad = [i for i in ids if i < 0]
        except IndexError:
            bad = [i for i in ids if not (0 <= i < len(table))]
        if bad:
            raise TokenizerError(f"token id {bad[0]} out of range, expected 0 <= id < {len(table)}")
        text = raw.decode("utf-8", errors="replace").replace(META_SPACE, " ")
        if self.record.add_dummy_prefix and text.startswith(" "):
            text = text[1:]
        return text

    def stream_decoder(self, drop_dummy_space: bool | None = None) -> "StreamDecoder":
        """A StreamDecoder; ``drop_dummy_space`` defaults to the vocabulary's add_dummy_prefix."""
        return StreamDecoder(self, drop_dummy_space)

    def __repr__(self):
        return (f"Tokenizer(n_pieces={self.vocab_size}, markers={len(self._markers)}, "
                f"add_dummy_prefix={self.add_dummy_prefix}, byte_fallback={self.record.byte_fallback})")
