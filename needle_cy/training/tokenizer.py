"""Train the project's SentencePiece BPE tokenizer on generated conversations.

Settings follow spec §6: BPE, identity normalization (no NFKC, no whitespace
collapsing, so the engine's reference encoder and the ``sentencepiece`` library
agree), byte fallback, pad 0 / eos 1 / bos 2 / unk 3, and the 16 chat markers as
user-defined pieces at ids 4–19. Digits are split so numbers are copied digit
by digit. Needs the ``sentencepiece`` package (extra ``[train]``).
"""
import io
import json

from .data import CHAT_MARKERS, compact, generate, load_catalogue, render


SOURCES = ("home", "mix", "mix2")


def corpus_lines(n_examples=20000, seed=1234, source="home"):
    """Text lines to train on: rendered conversations plus the smart-home catalogue.

    ``source`` "home" draws the smart-home generator's examples (the shipped
    tokenizer's text); "mix" draws the schema-general mix (``training.mix``: fresh
    catalogues from the tool corpus's training split, 35 % smart-home), whose general
    tool words the home text cuts into many pieces.  Measured on 800 mix conversations
    (seed 902) / 300 held-out-tool cases (seed 900), tokens each: the shipped 4,096
    pieces 623 / 616; trained on 6,000 mix conversations (seed 300) at 4,096 pieces
    530 / 468, at 8,192 508 / 444, at 16,384 496 / 432.  "mix2" draws the mix's version 2
    (the hand-written consumer catalogues added)."""
    if source not in SOURCES:
        raise ValueError(f"corpus_lines: source must be one of {SOURCES}, got {source!r}")
    if source in ("mix", "mix2"):
        from . import mix
        examples = mix.generate(n_examples, seed=seed, version=2 if source == "mix2" else 1)
    else:
        examples = generate(n_examples, seed=seed)
    lines = []
    for example in examples:
        prompt, target = render(example)
        lines.extend(x for x in (prompt + target).split("\n") if x)
    for tool in load_catalogue():
        lines.append(compact(tool))
    return lines


def train_tokenizer(model_prefix, vocab_size=4096, n_examples=20000, seed=1234, source="home"):
    """Write ``{model_prefix}.model`` / ``.vocab``; returns the .model path."""
    import sentencepiece as spm

    lines = corpus_lines(n_examples, seed, source)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=model_prefix,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        user_defined_symbols=CHAT_MARKERS,
        max_sentence_length=16384,
        num_threads=1,
        shuffle_input_sentence=False,
        input_sentence_size=0,
        minloglevel=2,
    )
    return model_prefix + ".model"


def check_tokenizer(model_path):
    """The fixed ids the spec requires; raises ValueError when one is off."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    expected = {0: "<pad>", 1: "</s>", 2: "<s>", 3: "<unk>"}
    for i, piece in expected.items():
        if sp.id_to_piece(i) != piece:
            raise ValueError(f"tokenizer id {i} is {sp.id_to_piece(i)!r}, expected {piece!r}")
    for i, marker in enumerate(CHAT_MARKERS, start=4):
        if sp.id_to_piece(i) != marker:
            raise ValueError(f"tokenizer id {i} is {sp.id_to_piece(i)!r}, expected {marker!r}")
    return sp


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Train the needle_cy SentencePiece tokenizer.")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    path = train_tokenizer(args.prefix, args.vocab)
    check_tokenizer(path)
    print(path)
