"""Grammar speed: per-step best_allowed over 2k/16k/32k vocabularies, and compile time.

Run:  pytest benchmarks/bench_grammar.py --benchmark-min-time=0.05 -q -s

Vocabularies: the fixture tokenizer (2,048 pieces) and SentencePiece BPE models of
16k and 32k pieces trained in the setup on generated text (cached in the temp dir).
A "realistic call" decodes the reference tool calls of the smart-home dev set with
the 20-tool catalogue; each step's logits are noise plus a boost on the reference
token (a trained model's arg-max is nearly always valid: the fast path), and a
second run moves the boost to a random token 30% of the time (the fallback walk).
Per-step mean / p99 are printed and stored in ``extra_info``.

Compile time: a new set of known tools, a set of never-seen schemas, 5-tool subsets,
the same set again, and the first compile in a fresh interpreter; llguidance's
grammar + matcher construction for the same sets side by side.
"""
import json
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from needle_cy.grammar import compile_tools
from needle_cy.testing.sentencepiece_pieces import sentencepiece_piece_table

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOOLS_PATH = SHARED / "eval" / "home_tools.json"
DEV_PATH = SHARED / "eval" / "home_dev.jsonl"
FIXTURE_SP = SHARED / "fixtures" / "needle3_tiny_a" / "tokenizer.model"
CACHE = Path(tempfile.gettempdir()) / "needle_cy_bench_grammar_sp"


def _require(path):
    if not path.exists():
        pytest.skip(f"missing {path}")
    return path


def _corpus(path, n_lines=60000, seed=0):
    """Generated text: pseudo-words, tool calls, JSON fragments (enough variety for 32k BPE)."""
    rng = random.Random(seed)
    syll = [a + b for a in "bcdfghjklmnprstvwz" for b in ["a", "e", "i", "o", "u", "ai", "ou", "ea"]]
    tools = json.loads(TOOLS_PATH.read_text())
    dev = [json.loads(line) for line in DEV_PATH.read_text().splitlines() if line.strip()]
    with open(path, "w") as f:
        for i in range(n_lines):
            r = rng.random()
            if r < 0.15:
                case = rng.choice(dev)
                f.write(case["query"] + "\n" + json.dumps(case["answers"], separators=(",", ":")) + "\n")
            elif r < 0.2:
                t = rng.choice(tools)
                f.write(json.dumps(t, separators=(",", ":")) + "\n")
            else:
                words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(4, 14))]
                f.write(" ".join(words) + rng.choice([".", "?", "!", ",", ":"]) + "\n")


def _train(size):
    import sentencepiece as spm
    CACHE.mkdir(exist_ok=True)
    model = CACHE / f"bpe{size}.model"
    if not model.exists():
        corpus = CACHE / "corpus.txt"
        if not corpus.exists():
            _corpus(corpus)
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(CACHE / f"bpe{size}"), vocab_size=size, model_type="bpe",
            byte_fallback=True, character_coverage=1.0, add_dummy_prefix=False, num_threads=2, minloglevel=2,
            input_sentence_size=200000, shuffle_input_sentence=True)
    return model


def _vocab(name):
    if name == "2k":
        return sentencepiece_piece_table(_require(FIXTURE_SP))
    _require(TOOLS_PATH)
    return sentencepiece_piece_table(_train({"16k": 16000, "32k": 32000}[name]))


def _calls():
    dev = [json.loads(line) for line in _require(DEV_PATH).read_text().splitlines() if line.strip()]
    return [json.dumps(c["answers"], separators=(",", ":")) for c in dev]


def _encode(sp, table, text):
    ids = sp.encode(text)
    # sentencepiece adds a leading "▁" (space) piece: drop pieces until the bytes match
    data = b"".join(table[i] for i in ids if table[i])
    if data != text.encode():
        ids = sp.encode(text, add_bos=False)
        data = b"".join(table[i] for i in ids if table[i])
        if data.startswith(b" "):
            first = table[ids[0]]
            if first == b" ":
                ids = ids[1:]
            else:
                return None
        if b"".join(table[i] for i in ids) != text.encode():
            return None
    return ids


def decode_calls(grammar, table, sp, calls, wrong_rate, seed=0):
    """Decode each call list with best_allowed; returns per-step seconds."""
    rng = np.random.default_rng(seed)
    n = len(table)
    steps = []
    for text in calls:
        ids = _encode(sp, table, text)
        if ids is None:
            continue
        state = grammar.start()
        for ref in ids:
            logits = rng.standard_normal(n).astype(np.float32)
            target = ref if rng.random() >= wrong_rate else int(rng.integers(n))
            logits[target] += 8.0
            t0 = time.perf_counter_ns()
            tok, new_state = grammar.best_allowed(state, logits, table)
            steps.append((time.perf_counter_ns() - t0) * 1e-9)
            if tok != ref:
                # follow the reference so the call stays realistic
                new_state = state.clone()
                assert new_state.feed(table[ref])
            state = new_state
    return np.asarray(steps)


@pytest.fixture(scope="module")
def tools():
    return json.loads(_require(TOOLS_PATH).read_text())


@pytest.mark.parametrize("vocab", ["2k", "16k", "32k"])
@pytest.mark.parametrize("wrong_rate", [0.0, 0.3])
def test_best_allowed_step(benchmark, tools, vocab, wrong_rate):
    sp, table = _vocab(vocab)
    g = compile_tools(tools)
    calls = _calls()[:40]
    g.allowed_tokens(g.start(), table)  # build the trie once (per vocabulary, not per step)
    runs = [benchmark.pedantic(decode_calls, args=(g, table, sp, calls, wrong_rate), rounds=1, iterations=1)]
    runs += [decode_calls(g, table, sp, calls, wrong_rate) for _ in range(2)]
    # per step, the best of 3 identical runs: removes preemption spikes of a shared machine
    steps = np.min(np.stack(runs), axis=0)
    raw = runs[0]
    mean, p99 = steps.mean() * 1e6, np.percentile(steps, 99) * 1e6
    benchmark.extra_info.update(vocab=len(table), steps=len(steps), mean_us=round(mean, 2), p99_us=round(p99, 2),
                                raw_mean_us=round(raw.mean() * 1e6, 2), raw_p99_us=round(np.percentile(raw, 99) * 1e6, 2))
    print(f"\nbest_allowed vocab={len(table)} wrong_rate={wrong_rate}: {len(steps)} steps, best-of-3 per step: "
          f"mean {mean:.1f} us, p50 {np.median(steps) * 1e6:.1f} us, p99 {p99:.1f} us, max {steps.max() * 1e6:.0f} us"
          f" | single run: mean {raw.mean() * 1e6:.1f} us, p99 {np.percentile(raw, 99) * 1e6:.1f} us")


@pytest.mark.parametrize("vocab", ["2k", "16k", "32k"])
def test_allowed_tokens_mask(benchmark, tools, vocab):
    """Full mask at the start of arguments and inside a free string (the trie walk)."""
    sp, table = _vocab(vocab)
    g = compile_tools(tools)
    s = g.start()
    assert s.feed(b'[{"name":"send_notification","arguments":{')
    g.allowed_tokens(s, table)
    benchmark(g.allowed_tokens, s, table)


def _renamed(tools, tag):
    """The same tools with every property name, required name and enum string suffixed:
    schemas never seen before (no fragment, enum or key-set automaton is cached)."""
    def mut(x):
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if k == "properties":
                    out[k] = {f"{name}{tag}": mut(sub) for name, sub in v.items()}
                elif k == "required":
                    out[k] = [f"{name}{tag}" for name in v]
                elif k == "enum":
                    out[k] = [f"{e}{tag}" if isinstance(e, str) else e for e in v]
                else:
                    out[k] = mut(v)
            return out
        if isinstance(x, list):
            return [mut(v) for v in x]
        return x
    return [dict(t, parameters=mut(t["parameters"])) for t in tools]


def _rotating(items):
    it = iter(range(10 ** 9))
    return lambda: items[next(it) % len(items)]


def test_compile_tools(benchmark, tools):
    """A new 20-tool set of known tools: every call a new order with new descriptions, so the
    set cache misses; per-tool fragments and the tool-name automaton are reused."""
    for t in tools:
        compile_tools([t])
    rng = random.Random(0)
    sets = []
    for i in range(400):
        s = [dict(t, description=f"{t['description']} ({i})") for t in tools]
        rng.shuffle(s)
        sets.append(s)
    nxt = _rotating(sets)
    benchmark.pedantic(lambda: compile_tools(nxt()), rounds=300, iterations=1, warmup_rounds=5)


def test_compile_tools_new_schemas(benchmark, tools):
    """A 20-tool set whose schemas were never seen (renamed properties and enum values):
    every fragment compiled from scratch; only pattern/format automata are reused."""
    compile_tools(tools)
    sets = [_renamed(tools, f"_{i}") for i in range(60)]
    nxt = _rotating(sets)
    benchmark.pedantic(lambda: compile_tools(nxt()), rounds=40, iterations=1, warmup_rounds=2)


def test_compile_tools_repeated(benchmark, tools):
    """The same tool set again (the agent's common case): served from the set cache."""
    compile_tools(tools)
    benchmark.pedantic(compile_tools, args=(tools,), rounds=300, iterations=1, warmup_rounds=5)


def test_compile_tools_subset(benchmark, tools):
    """New 5-tool subsets of known tools (set cache misses; the name automaton of a subset
    is built on its first use, the first rounds included)."""
    rng = random.Random(0)
    sets = [rng.sample(tools, 5) for _ in range(2000)]
    for t in tools:
        compile_tools([t])
    nxt = _rotating(sets)
    benchmark.pedantic(lambda: compile_tools(nxt()), rounds=300, iterations=1, warmup_rounds=5)


_COLD = """
import json, sys, time
t0 = time.perf_counter()
import numpy
t1 = time.perf_counter()
from needle_cy.grammar import compile_tools
t2 = time.perf_counter()
tools = json.loads(open(sys.argv[1]).read())
t3 = time.perf_counter()
compile_tools(tools)
t4 = time.perf_counter()
print(json.dumps({"numpy_ms": (t1 - t0) * 1e3, "import_ms": (t2 - t1) * 1e3, "compile_ms": (t4 - t3) * 1e3}))
"""


def test_compile_tools_cold(benchmark, tools, tmp_path):
    """First compile of the catalogue in a fresh interpreter (no cache of any kind), after
    `import needle_cy.grammar`; bytecode cached as in an installed package."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tmp_path / "pyc"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, "-c", _COLD, str(TOOLS_PATH)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)   # writes the bytecode cache
    runs = []

    def cold():
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    benchmark.pedantic(cold, rounds=5, iterations=1)
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    benchmark.extra_info.update({f"best_{k}": round(v, 2) for k, v in best.items()})
    benchmark.extra_info.update({f"median_{k}": round(v, 2) for k, v in med.items()})
    print(f"\ncold: import numpy {med['numpy_ms']:.0f} ms, import needle_cy.grammar {med['import_ms']:.1f} ms, "
          f"first compile_tools {med['compile_ms']:.1f} ms (median of 5; best {best['compile_ms']:.1f} ms)")


# ----------------------------------------------------------------------------- peers (side by side)

class _SPTokenizer:
    """The minimal tokenizer object llguidance's TokenizerWrapper wants."""

    def __init__(self, sp, table):
        self.sp = sp
        self.tokens = [p if p else b"" for p in table]
        self.eos_token_id = sp.eos_id() if sp.eos_id() >= 0 else 0
        self.bos_token_id = sp.bos_id() if sp.bos_id() >= 0 else None
        self.special_token_ids = [i for i, p in enumerate(table) if p is None]

    def __call__(self, data):
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        return self.sp.encode(text)


def _strip_unique(x):
    """llguidance refuses uniqueItems ("Unimplemented keys"): drop it for the peer."""
    if isinstance(x, dict):
        return {k: _strip_unique(v) for k, v in x.items() if k != "uniqueItems"}
    if isinstance(x, list):
        return [_strip_unique(v) for v in x]
    return x


def _calls_schema(tools, max_calls=4):
    """The same call language as compile_tools, as a JSON Schema (no distinct-tool rule, no uniqueItems)."""
    tools = _strip_unique(tools)
    return {"type": "array", "maxItems": max_calls, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
         "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}}


def _llg():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401
    except ImportError:
        pytest.skip("llguidance not installed")
    return llguidance


@pytest.mark.parametrize("vocab", ["2k", "16k", "32k"])
def test_llguidance_step(benchmark, tools, vocab):
    """llguidance: mask + consume per step on the same calls (its documented numpy path)."""
    llg = _llg()
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
    sp, table = _vocab(vocab)
    tok = llg.LLTokenizer(llg.TokenizerWrapper(_SPTokenizer(sp, table)))
    grammar = llg.LLMatcher.grammar_from_json_schema(_calls_schema(tools),
                                                     defaults={"whitespace_flexible": False})
    calls = _calls()[:40]
    bitmask = allocate_token_bitmask(1, tok.vocab_size)

    def run():
        steps = []
        for text in calls:
            ids = _encode(sp, table, text)
            if ids is None:
                continue
            m = llg.LLMatcher(tok, grammar)
            for ref in ids:
                t0 = time.perf_counter_ns()
                fill_next_token_bitmask(m, bitmask, 0)
                ok = m.consume_token(ref)
                steps.append((time.perf_counter_ns() - t0) * 1e-9)
                if not ok:
                    break
        return np.asarray(steps)

    runs = [benchmark.pedantic(run, rounds=1, iterations=1), run(), run()]
    n = min(len(r) for r in runs)
    steps = np.min(np.stack([r[:n] for r in runs]), axis=0)
    mean, p99 = steps.mean() * 1e6, np.percentile(steps, 99) * 1e6
    benchmark.extra_info.update(vocab=len(table), steps=n, mean_us=round(mean, 2), p99_us=round(p99, 2))
    print(f"\nllguidance vocab={len(table)}: {n} steps, best-of-3 per step: mean {mean:.1f} us, "
          f"p50 {np.median(steps) * 1e6:.1f} us, p99 {p99:.1f} us")


@pytest.mark.parametrize("n_tools", [20, 5])
def test_llguidance_compile(benchmark, tools, n_tools):
    """llguidance: JSON-schema grammar + matcher for the same tool sets (16k vocabulary)."""
    llg = _llg()
    sp, table = _vocab("16k")
    tok = llg.LLTokenizer(llg.TokenizerWrapper(_SPTokenizer(sp, table)))
    rng = random.Random(0)
    sets = [tools if n_tools == 20 else rng.sample(tools, n_tools) for _ in range(50)]
    nxt = _rotating(sets)

    def build():
        g = llg.LLMatcher.grammar_from_json_schema(_calls_schema(nxt()), defaults={"whitespace_flexible": False})
        return llg.LLMatcher(tok, g)
    benchmark.pedantic(build, rounds=30, iterations=1, warmup_rounds=2)
