"""Tokenizer throughput, single thread, side by side in one run.

    pytest benchmarks/bench_tokenizer.py --benchmark-timer=time.process_time   # pytest-benchmark
    NEEDLE_CY_BENCH_MB=1 pytest benchmarks/bench_tokenizer.py ...                # a quick run
    python benchmarks/bench_tokenizer.py [--mb 10] [--out /tmp/tokenizer.md]

Encoders: needle_cy (Cython priority-queue BPE), the ``sentencepiece`` library, HF
``tokenizers`` (configured to the same model, see tests/test_tokenizer_fuzz.py) and the
pure-Python reference (on a small slice; its MB/s is measured on that slice).

Corpora (generated deterministically): English-like paragraphs, and tool-JSON-heavy prompts
rendered with the training template (§7.1); each is a list of documents encoded one call at a
time, as an engine would.  Plus a no-space string at growing lengths (4k…256k characters) to
show near-linear growth (a naive rescan BPE is quadratic there).
"""
import functools
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")        # HF tokenizers: single thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import pytest  # noqa: E402

from needle_cy.reference import bpe as ref  # noqa: E402
from needle_cy.tokenizer import Tokenizer  # noqa: E402

FIXTURES = Path(os.environ.get("NEEDLE_CY_FIXTURES", REPO.parent / "shared" / "fixtures"))
MODEL_DIR = FIXTURES / "needle3_tiny_a"
CORPUS_MB = float(os.environ.get("NEEDLE_CY_BENCH_MB", "10"))
REFERENCE_SLICE_BYTES = 8_000

WORDS = ("the of and to a in is you that it he was for on are as with his they I at be this have from "
         "or one had by word but not what all were we when your can said there use an each which she do "
         "how their if will up other about out many then them these so some her would make like him into "
         "time has look two more write go see number no way could people my than first water been call who "
         "oil its now find long down day did get come made may part lights kitchen thermostat temperature "
         "reminder tomorrow morning evening weather forecast music volume bedroom living room garage door "
         "lock unlock schedule meeting calendar message send email timer minutes seconds hours degrees").split()


def english_corpus(n_bytes, seed=0):
    """Paragraphs of Zipf-weighted English words with punctuation, numbers and newlines."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.9 for rank in range(len(WORDS))]
    docs, total = [], 0
    while total < n_bytes:
        sentences = []
        for _ in range(rng.randint(4, 14)):
            words = rng.choices(WORDS, weights, k=rng.randint(5, 22))
            words[0] = words[0].capitalize()
            if rng.random() < 0.2:
                words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 5))))
            if rng.random() < 0.3:
                words[rng.randrange(len(words))] += ","
            sentences.append(" ".join(words) + rng.choice([".", ".", ".", "?", "!"]))
        doc = " ".join(sentences) + "\n"
        docs.append(doc)
        total += len(doc.encode())
    return docs


def _tool(rng):
    name = "_".join(rng.sample(WORDS[-40:], 2))
    props = {}
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["string", "integer", "number", "boolean", "enum"])
        key = rng.choice(WORDS[-40:]) + rng.choice(["", "_id", "_name", "_level", "_percent"])
        desc = " ".join(rng.choices(WORDS, k=rng.randint(3, 12))).capitalize() + "."
        if kind == "enum":
            props[key] = {"type": "string", "enum": rng.sample(WORDS, rng.randint(2, 6)), "description": desc}
        elif kind == "integer":
            props[key] = {"type": "integer", "description": desc, "minimum": 0, "maximum": rng.randint(1, 1000)}
        else:
            props[key] = {"type": kind, "description": desc}
    return {"name": name, "description": " ".join(rng.choices(WORDS, k=rng.randint(8, 30))).capitalize() + ".",
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}


def tool_prompt_corpus(n_bytes, seed=1):
    """Prompts in the training template with 1–6 compact tool JSON schemas and a short query."""
    rng = random.Random(seed)
    docs, total = [], 0
    while total < n_bytes:
        tools = json.dumps([_tool(rng) for _ in range(rng.randint(1, 6))], separators=(",", ":"),
                           ensure_ascii=False)
        query = " ".join(rng.choices(WORDS, k=rng.randint(4, 16)))
        system = "" if rng.random() < 0.5 else f"Today is 2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}. Home: Berlin."
        prompt = (f"<|im_start|>system\n{system}<|im_end|>\n" if system else "") + \
            f"<|im_start|>user\n<tools>{tools}</tools>\n{query}<|im_end|>\n<|im_start|>assistant\n"
        if rng.random() < 0.5:  # a teacher-forced answer
            prompt += "<tool_call>" + json.dumps([{"name": "x", "arguments": {"a": rng.randint(0, 99)}}],
                                                 separators=(",", ":")) + "</tool_call><|im_end|>"
        docs.append(prompt)
        total += len(prompt.encode())
    return docs


def no_space_string(n_chars, seed=2):
    """English text with the spaces removed: one long BPE segment."""
    text = "".join(english_corpus(n_chars * 2, seed)).replace(" ", "").replace("\n", "")
    return text[:n_chars]


# ----------------------------------------------------------------------------------------- encoders
def load_encoders():
    """name → callable(text) -> ids, all on the fixture vocabulary."""
    needle = Tokenizer.from_archive(MODEL_DIR / "model.cact")
    # The spec encoding (markers in the rendered prompts become marker ids), as the others do.
    encoders = {"needle_cy": functools.partial(needle.encode, allowed_special="all")}
    try:
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(MODEL_DIR / "tokenizer.model"),
                                                         num_threads=1)
        encoders["sentencepiece"] = processor.encode
    except ImportError:
        pass
    try:
        from test_tokenizer_fuzz import hf_tokenizer

        hf = hf_tokenizer(needle.record)
        encoders["hf_tokenizers"] = lambda text: hf.encode(" " + text, add_special_tokens=False).ids
    except ImportError:
        pass
    encoders["reference"] = lambda text: ref.encode(text, needle.record)
    return needle, encoders


def encode_all(encode, docs):
    for doc in docs:
        encode(doc)


def reference_slice(docs):
    out, total = [], 0
    for doc in docs:
        if total >= REFERENCE_SLICE_BYTES:
            break
        out.append(doc)
        total += len(doc.encode())
    return out


# ----------------------------------------------------------------------------------------- pytest
@pytest.fixture(scope="module")
def setup():
    if not (MODEL_DIR / "model.cact").exists():
        pytest.skip(f"LOUD SKIP: fixture missing: {MODEL_DIR}")
    needle, encoders = load_encoders()
    n_bytes = int(CORPUS_MB * 1e6)
    corpora = {"english": english_corpus(n_bytes), "tool_json": tool_prompt_corpus(n_bytes)}
    return needle, encoders, corpora


@pytest.mark.parametrize("corpus", ["english", "tool_json"])
@pytest.mark.parametrize("encoder", ["needle_cy", "sentencepiece", "hf_tokenizers", "reference"])
def test_throughput(benchmark, setup, corpus, encoder):
    _, encoders, corpora = setup
    if encoder not in encoders:
        pytest.skip(f"{encoder} not installed")
    docs = corpora[corpus] if encoder != "reference" else reference_slice(corpora[corpus])
    n_bytes = sum(len(d.encode()) for d in docs)
    benchmark.group = f"tokenizer {corpus}"
    benchmark.extra_info["bytes"] = n_bytes
    benchmark.pedantic(encode_all, args=(encoders[encoder], docs), rounds=1 if encoder != "reference" else 2,
                       iterations=1, warmup_rounds=0)
    benchmark.extra_info["MB_per_s"] = n_bytes / 1e6 / benchmark.stats.stats.min


@pytest.mark.parametrize("n_chars", [4_096, 16_384, 65_536, 262_144])
@pytest.mark.parametrize("encoder", ["needle_cy", "sentencepiece"])
def test_no_space_growth(benchmark, setup, encoder, n_chars):
    _, encoders, _ = setup
    if encoder not in encoders:
        pytest.skip(f"{encoder} not installed")
    text = no_space_string(n_chars)
    benchmark.group = f"tokenizer no-space {encoder}"
    benchmark.extra_info["chars"] = n_chars
    benchmark.pedantic(encoders[encoder], args=(text,), rounds=3, iterations=1)
    benchmark.extra_info["ns_per_char"] = benchmark.stats.stats.min / n_chars * 1e9


# ----------------------------------------------------------------------------------------- script
def _best(fn, *args, repeat=2):
    """Best CPU seconds of this process (single-threaded work; robust to a shared, loaded machine)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn(*args)
        best = min(best, time.process_time() - start)
    return best


def main(argv=None):
    import argparse
    import platform

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=CORPUS_MB, help="MB per corpus (default 10)")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    needle, encoders = load_encoders()
    n_bytes = int(args.mb * 1e6)
    corpora = {"English-like text": english_corpus(n_bytes), "tool-JSON prompts": tool_prompt_corpus(n_bytes)}
    lines = [f"Single thread, {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
             f"{args.mb:g} MB per corpus as separate documents (reference: first {REFERENCE_SLICE_BYTES // 1000} kB), "
             "best of 2, CPU time of the process (time.process_time).",
             "", "| corpus | " + " | ".join(encoders) + " | needle_cy / sentencepiece | needle_cy / HF |",
             "|---|" + "---:|" * (len(encoders) + 2)]
    for corpus, docs in corpora.items():
        rates = {}
        for name, encode in encoders.items():
            part = reference_slice(docs) if name == "reference" else docs
            size = sum(len(d.encode()) for d in part)
            rates[name] = size / 1e6 / _best(encode_all, encode, part, repeat=2 if name != "hf_tokenizers" else 1)
            print(f"{corpus:20s} {name:15s} {rates[name]:8.2f} MB/s", flush=True)
        ratio_sp = rates["needle_cy"] / rates["sentencepiece"] if "sentencepiece" in rates else float("nan")
        ratio_hf = rates["needle_cy"] / rates["hf_tokenizers"] if "hf_tokenizers" in rates else float("nan")
        lines.append(f"| {corpus} | " + " | ".join(f"{rates[n]:.3g} MB/s" for n in encoders)
                     + f" | {ratio_sp:.1f}× | {ratio_hf:.1f}× |")
    lines += ["", "No-space string (one BPE segment; ns/char should stay nearly flat — O(n log n)):", "",
              "| characters | " + " | ".join(f"{name} ms (ns/char)" for name in encoders) + " |",
              "|---:|" + "---:|" * len(encoders)]
    for n_chars in (1_024, 2_048, 4_096, 16_384, 65_536, 262_144):
        text = no_space_string(n_chars)
        cells = []
        for name, encode in encoders.items():
            if name == "reference" and n_chars > 2_048:  # quadratic: 4× per doubling
                cells.append("—")
                continue
            seconds = _best(encode, text, repeat=1 if name == "reference" else 3)
            cells.append(f"{seconds * 1e3:.2f} ({seconds / n_chars * 1e9:.0f})")
        lines.append(f"| {n_chars:,} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
