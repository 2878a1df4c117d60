"""The grammar's piece table (exact output bytes per id) read straight from a
SentencePiece model, for tests and benchmarks that use models without an archive."""


def sentencepiece_piece_table(model_path):
    """(processor, table): entry i is token i's output bytes (▁ → space, <0xNN> byte
    pieces → that byte), None for control and unknown pieces."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    table = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            table.append(None)
            continue
        p = sp.id_to_piece(i)
        table.append(bytes([int(p[3:5], 16)]) if sp.is_byte(i) else p.replace("\u2581", " ").encode("utf-8"))
    return sp, table
