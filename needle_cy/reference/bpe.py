"""Pure-Python twin of ``needle_cy._bpe``: the tokenizer encoding of spec §6.2, literally.

This is the executable specification the Cython encoder is diffed against.  It
rescans every adjacent pair after each merge, so it is quadratic in the segment
length: use it on short strings only.

``vocab`` is any object with the parsed tokenizer record's fields
(``needle_cy.tokenizer.TokenizerRecord``): ``pieces`` (surfaces, id order),
``scores``, ``types``, ``unk_id``, ``add_dummy_prefix``, ``byte_fallback``.
"""

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 0, 1, 2, 3, 4
META_SPACE = "\u2581"  # "▁", SentencePiece's visible space
# Text mode never forms these from their surface: their ids stand for something else.
NOT_TEXT = (UNKNOWN, CONTROL, USER_DEFINED, BYTE)


def surface_to_id(vocab):
    """Surface → id over every piece of every type; a duplicated surface keeps the highest id (§6.2 step 6)."""
    table = {}
    for piece_id, surface in enumerate(vocab.pieces):
        table[surface] = piece_id
    return table


def byte_to_id(vocab):
    """Byte value → id of its ``<0xHH>`` BYTE piece (hex digits at characters 3–4, §6.1)."""
    table = {}
    for piece_id, (surface, piece_type) in enumerate(zip(vocab.pieces, vocab.types)):
        if piece_type == BYTE:
            table[int(surface[3:5], 16)] = piece_id
    return table


def markers_in_match_order(vocab):
    """USER_DEFINED pieces as (surface, id), longest surface first, ties in id order (§6.2 step 4)."""
    markers = [(surface, piece_id) for piece_id, (surface, piece_type)
               in enumerate(zip(vocab.pieces, vocab.types)) if piece_type == USER_DEFINED]
    markers.sort(key=lambda marker: (-len(marker[0]), marker[1]))
    return markers


def text_surfaces(vocab):
    """``surface_to_id`` without the surfaces whose piece text mode never forms."""
    return {surface: piece_id for surface, piece_id in surface_to_id(vocab).items()
            if vocab.types[piece_id] not in NOT_TEXT}


def bpe_segment(segment, vocab, surfaces=None, bytes_=None):
    """Ids of one marker-free segment (§6.2 step 5): score-ordered merges, then the id
    mapping.  ``surfaces``: the pieces symbols may become (``text_surfaces`` in text mode)."""
    surfaces = surface_to_id(vocab) if surfaces is None else surfaces
    bytes_ = byte_to_id(vocab) if bytes_ is None else bytes_
    symbols = list(segment)
    while True:
        # Among all adjacent pairs whose concatenation is a piece, the highest score wins;
        # the strict ">" in a left-to-right scan keeps the leftmost of equal scores.
        best_index, best_score = -1, None
        for index in range(len(symbols) - 1):
            piece_id = surfaces.get(symbols[index] + symbols[index + 1])
            if piece_id is not None:
                score = vocab.scores[piece_id]
                if best_score is None or score > best_score:
                    best_index, best_score = index, score
        if best_index < 0:
            break
        symbols[best_index:best_index + 2] = [symbols[best_index] + symbols[best_index + 1]]

    ids = []
    for symbol in symbols:
        piece_id = surfaces.get(symbol)
        if piece_id is not None:
            ids.append(piece_id)
        elif vocab.byte_fallback:
            # A missing <0xHH> piece makes the official reference raise; the spec's
            # recommended engine behaviour (§6.2 step 7) is unk for that byte.
            ids.extend(bytes_.get(byte, vocab.unk_id) for byte in symbol.encode("utf-8"))
        else:
            ids.append(vocab.unk_id)
    return ids


def encode(text, vocab, dummy_prefix=True, allowed_ids=None):
    """Token ids of ``text`` (no BOS/EOS), spec §6.2.

    ``dummy_prefix=False`` encodes a continuation (spec §7.2): the "▁" of step 3 is
    not prepended even when the vocabulary asks for it.

    ``allowed_ids=None`` is §6.2 as written.  A collection of marker ids is text mode:
    only those markers are matched, and no symbol becomes a piece of a ``NOT_TEXT`` type
    (such a merge is not a candidate, such a character is a non-piece), so every other
    marker spelling is ordinary pieces or byte fallback.
    """
    for index, char in enumerate(text):
        if 0xD800 <= ord(char) <= 0xDFFF:
            raise ValueError(f"text contains a lone surrogate U+{ord(char):04X} at index {index}")
    if not text:
        return []
    escaped = text.replace(" ", META_SPACE)
    if vocab.add_dummy_prefix and dummy_prefix:
        escaped = META_SPACE + escaped
    surfaces, bytes_ = surface_to_id(vocab), byte_to_id(vocab)
    markers = markers_in_match_order(vocab)
    if allowed_ids is not None:
        surfaces = text_surfaces(vocab)
        markers = [(surface, marker_id) for surface, marker_id in markers if marker_id in set(allowed_ids)]

    ids, buffer, position = [], [], 0
    while position < len(escaped):
        for surface, marker_id in markers:
            if escaped.startswith(surface, position):
                ids.extend(bpe_segment(buffer, vocab, surfaces, bytes_))
                buffer = []
                ids.append(marker_id)
                position += len(surface)
                break
        else:
            buffer.append(escaped[position])
            position += 1
    ids.extend(bpe_segment(buffer, vocab, surfaces, bytes_))
    return ids


def decode(ids, vocab):
    """Text of ``ids`` (spec §6.3): bytes joined, UTF-8 with U+FFFD, "▁" → " ", one dummy space dropped."""
    out = bytearray()
    for piece_id in ids:
        piece_type = vocab.types[piece_id]
        if piece_type == BYTE:
            out.append(int(vocab.pieces[piece_id][3:5], 16))
        elif piece_type in (CONTROL, UNKNOWN):
            continue
        else:
            out += vocab.pieces[piece_id].encode("utf-8")
    text = out.decode("utf-8", errors="replace").replace(META_SPACE, " ")
    if vocab.add_dummy_prefix and text.startswith(" "):
        text = text[1:]
    return text
