"""Whole-model speed: the Cython engine vs the NumPy reference, side by side in one run.

    pytest benchmarks/bench_model.py --benchmark-min-time=0.05 --benchmark-max-time=0.5 \
        --benchmark-min-rounds=3 --benchmark-columns=min,median,rounds
    NEEDLE_CY_BENCH_TABLE=/tmp/model.md pytest benchmarks/bench_model.py ...
        (also writes the tokens/s + memory table, from each benchmark's minimum)
    NEEDLE_CY_BENCH_BITS=4 NEEDLE_CY_BENCH_THREADS=1 NEEDLE_CY_BENCH_REFERENCE=0 pytest ...
        (one width, one thread count; skip the slow NumPy reference; the default
        thread list is 1,2,auto — auto = the default policy, a tuner picking per call)
    pytest benchmarks/bench_model.py --benchmark-timer=time.process_time ...
        (CPU seconds instead of wall time: on a shared, overloaded machine this is
        what an idle core would take, for single-threaded runs)

The archive is the random full-size model (20 layers, d_model 768, vocab 16384,
the default geometry of ``needle_cy.testing.make_random_archive``) at 2 and 4 bits,
written once into a cache folder under the system temp dir.

* ``prefill``: a 600-token prompt on a fresh state (tokens/s = 600 / time);
* ``decode``: 16 ``step`` calls after a 64- and after a 600-token prompt (the state
  is restored from a snapshot before every round, outside the timing);
  ``NEEDLE_CY_BENCH_DECODE_AFTER=600`` picks the prompt lengths,
  ``NEEDLE_CY_BENCH_DECODE_ROUNDS=10`` the rounds (default 5) the minimum is taken over;
* ``memory``: in a fresh subprocess, load + prefill + 64 steps, the prefill 600
  tokens and, separately, the full KV window (max_seq_len − 64 = 4032 tokens, so the
  64 steps end with every cache slot written); the peak anonymous resident memory
  (``RssAnon + RssShmem``, i.e. not counting the mapped archive pages) minus the same
  figure after importing numpy and needle_cy.  ``NEEDLE_CY_BENCH_MEMORY=600`` (or
  ``full``, ``none``) picks which.

Deploy numerics, 1 and 2 threads and the automatic choice; the reference runs
single-threaded once per width.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from needle_cy.model import Model

BITS = [int(b) for b in os.environ.get("NEEDLE_CY_BENCH_BITS", "2,4").split(",")]
# thread counts, or "auto" (the automatic policy: needle_cy.threads.ThreadTuner)
THREADS = [t if t == "auto" else int(t) for t in os.environ.get("NEEDLE_CY_BENCH_THREADS", "1,2,auto").split(",")]
PROMPT = 600
DECODE_STEPS = 16
DECODE_AFTER = [int(n) for n in os.environ.get("NEEDLE_CY_BENCH_DECODE_AFTER", "64,600").split(",")]
DECODE_ROUNDS = int(os.environ.get("NEEDLE_CY_BENCH_DECODE_ROUNDS", "5"))    # minimum over these
MEMORY_CONTEXTS = [c for c in os.environ.get("NEEDLE_CY_BENCH_MEMORY", "600,full").split(",") if c != "none"]
MEMORY_STEPS = 64
RUN_REFERENCE = os.environ.get("NEEDLE_CY_BENCH_REFERENCE", "1") != "0"
CACHE = Path(os.environ.get("NEEDLE_CY_BENCH_CACHE", Path(tempfile.gettempdir()) / "needle_cy_bench"))
RESULTS = {}   # (kind, impl, bits, threads) -> seconds (minimum) or MB


def archive_path(bits):
    """The random full-size archive at this width (created once, then reused)."""
    path = CACHE / f"full{bits}.cact"
    if not path.exists():
        from needle_cy.testing.make_random_archive import make_random_archive
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        make_random_archive(tmp, bits=bits)
        os.replace(tmp, path)
    return path


def prompt_ids(prompt=PROMPT):
    return np.random.default_rng(0).integers(4, 16000, size=prompt + DECODE_STEPS)


_models = {}


def model(bits, backend, threads):
    key = (bits, backend, threads)
    if key not in _models:
        _models[key] = Model.load(archive_path(bits), backend=backend, threads=threads)
        if threads == "auto":
            assert _models[key].thread_tuner is not None, "auto: no tuner (one core, or no Cython engine)"
    return _models[key]


def _record(benchmark, kind, impl, bits, threads, tokens):
    seconds = benchmark.stats.stats.min
    RESULTS[(kind, impl, bits, threads)] = seconds
    benchmark.extra_info["tokens_per_s"] = tokens / seconds


def _impls():
    out = [("cython", t) for t in THREADS]
    if RUN_REFERENCE:
        out.append(("numpy", 1))
    return out


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("impl,threads", _impls())
def test_prefill(benchmark, bits, impl, threads):
    m = model(bits, impl, threads)
    ids = prompt_ids()[:PROMPT]
    rounds = 1 if impl == "numpy" else None

    def run():
        m.reset()
        return m.prefill(ids)

    if rounds:
        benchmark.pedantic(run, rounds=1, iterations=1)
    else:
        benchmark(run)
    _record(benchmark, "prefill", impl, bits, threads, PROMPT)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("impl,threads", _impls())
@pytest.mark.parametrize("after", DECODE_AFTER)
def test_decode(benchmark, bits, impl, threads, after):
    m = model(bits, impl, threads)
    ids = prompt_ids(after)
    m.reset()
    m.prefill(ids[:after])
    snap = m.snapshot()
    steps = [int(t) for t in ids[after:]]

    def setup():
        m.restore(snap)

    def run():
        for t in steps:
            m.step(t)

    benchmark.pedantic(run, setup=setup, rounds=1 if impl == "numpy" else DECODE_ROUNDS, iterations=1)
    _record(benchmark, f"decode{after}", impl, bits, threads, DECODE_STEPS)


MEMORY_SCRIPT = r"""
import json, sys
def anon():
    total = 0.0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) / 1024.0
    return total
import numpy as np
from needle_cy.model import Model
base = anon()
peak = base
m = Model.load(sys.argv[1], backend="cython", threads=sys.argv[2] if sys.argv[2] == "auto" else int(sys.argv[2]))
peak = max(peak, anon())
steps = int(sys.argv[4])
prompt = m.max_seq_len - steps if sys.argv[3] == "full" else int(sys.argv[3])
ids = np.random.default_rng(0).integers(4, 16000, size=prompt + steps)
for start in range(0, prompt, 512):          # chunked, so the peak is sampled as it grows
    m.prefill(ids[start:min(start + 512, prompt)])
    peak = max(peak, anon())
for t in ids[prompt:]:
    m.step(int(t))
    peak = max(peak, anon())
state = m.engine.state
print(json.dumps({"base_mb": base, "peak_mb": peak, "beyond_mb": peak - base, "context": m.position,
                  "state_mb": state.nbytes / 2**20,
                  "kv_storage": getattr(m.engine, "kv_storage", "float32")}))
"""


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("context", MEMORY_CONTEXTS)
def test_memory(benchmark, bits, threads, context):
    path = archive_path(bits)

    def run():
        out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path), str(threads), context,
                              str(MEMORY_STEPS)], check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    res = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    RESULTS[(f"memory{context}", "cython", bits, threads)] = res["beyond_mb"]


def test_write_table():
    """Render the side-by-side table (and write it when NEEDLE_CY_BENCH_TABLE is set)."""
    if not RESULTS:
        pytest.skip("no benchmark ran")
    head = ["width", "engine", "threads", f"prefill tok/s ({PROMPT})"]
    head += [f"decode tok/s (after {n})" for n in DECODE_AFTER]
    head += [f"memory beyond the mapped file ({'full window' if c == 'full' else f'{c} + {MEMORY_STEPS}'})"
             for c in MEMORY_CONTEXTS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for bits in BITS:
        for impl, threads in _impls():
            pf = RESULTS.get(("prefill", impl, bits, threads))
            cells = [f"{bits}-bit", impl, str(threads), f"{PROMPT / pf:,.0f}" if pf else "–"]
            for n in DECODE_AFTER:
                dc = RESULTS.get((f"decode{n}", impl, bits, threads))
                cells.append(f"{DECODE_STEPS / dc:,.1f}" if dc else "–")
            for c in MEMORY_CONTEXTS:
                mem = RESULTS.get((f"memory{c}", impl, bits, threads))
                cells.append(f"{mem:.1f} MB" if mem else "–")
            lines.append("| " + " | ".join(cells) + " |")
        ref_pf = RESULTS.get(("prefill", "numpy", bits, 1))
        ref_dc = RESULTS.get((f"decode{DECODE_AFTER[-1]}", "numpy", bits, 1))
        for threads in THREADS:
            pf = RESULTS.get(("prefill", "cython", bits, threads))
            dc = RESULTS.get((f"decode{DECODE_AFTER[-1]}", "cython", bits, threads))
            if ref_pf and pf and ref_dc and dc:
                lines.append(f"|  | speed-up vs numpy (decode after {DECODE_AFTER[-1]}) | {threads} | "
                             f"×{ref_pf / pf:,.0f} | ×{ref_dc / dc:,.0f} |")
    table = "\n".join(lines)
    print("\n" + table)
    target = os.environ.get("NEEDLE_CY_BENCH_TABLE")
    if target:
        Path(target).write_text(table + "\n")
