"""Whole-model speed: the Cython engine vs the NumPy reference, side by side in one run.

    pytest benchmarks/bench_model.py --benchmark-min-time=0.05 --benchmark-max-time=0.5 \
        --benchmark-min-rounds=3 --benchmark-columns=min,median,rounds
    NEEDLE_CY_BENCH_TABLE=benchmarks/results_model.md pytest benchmarks/bench_model.py ...
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
* ``decode``: 16 ``step`` calls after that 600-token prompt (the state is restored
  from a snapshot before every round, outside the timing);
* ``memory``: in a fresh subprocess, load + 600-token prefill + 64 steps; the peak
  anonymous resident memory (``RssAnon + RssShmem``, i.e. not counting the mapped
  archive pages) minus the same figure after importing numpy and needle_cy.

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


def prompt_ids():
    return np.random.default_rng(0).integers(4, 16000, size=PROMPT + DECODE_STEPS)


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
def test_decode(benchmark, bits, impl, threads):
    m = model(bits, impl, threads)
    ids = prompt_ids()
    m.reset()
    m.prefill(ids[:PROMPT])
    snap = m.snapshot()
    steps = [int(t) for t in ids[PROMPT:]]

    def setup():
        m.restore(snap)

    def run():
        for t in steps:
            m.step(t)

    benchmark.pedantic(run, setup=setup, rounds=1 if impl == "numpy" else 5, iterations=1)
    _record(benchmark, "decode", impl, bits, threads, DECODE_STEPS)


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
ids = np.random.default_rng(0).integers(4, 16000, size=600 + 64)
m.prefill(ids[:600])
peak = max(peak, anon())
for t in ids[600:]:
    m.step(int(t))
    peak = max(peak, anon())
print(json.dumps({"base_mb": base, "peak_mb": peak, "beyond_mb": peak - base}))
"""


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("threads", THREADS)
def test_memory(benchmark, bits, threads):
    path = archive_path(bits)

    def run():
        out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path), str(threads)],
                             check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    res = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    RESULTS[("memory", "cython", bits, threads)] = res["beyond_mb"]


def test_write_table():
    """Render the side-by-side table (and write it when NEEDLE_CY_BENCH_TABLE is set)."""
    if not RESULTS:
        pytest.skip("no benchmark ran")
    lines = ["| width | engine | threads | prefill tok/s (600) | decode tok/s (after 600) | memory beyond the mapped file |",
             "|---|---|---|---|---|---|"]
    for bits in BITS:
        for impl, threads in _impls():
            pf = RESULTS.get(("prefill", impl, bits, threads))
            dc = RESULTS.get(("decode", impl, bits, threads))
            mem = RESULTS.get(("memory", impl, bits, threads))
            lines.append(f"| {bits}-bit | {impl} | {threads} | "
                         f"{PROMPT / pf:,.0f} | " if pf else f"| {bits}-bit | {impl} | {threads} | – | ")
            lines[-1] += (f"{DECODE_STEPS / dc:,.1f} | " if dc else "– | ") + (f"{mem:.1f} MB |" if mem else "– |")
        ref_pf = RESULTS.get(("prefill", "numpy", bits, 1))
        ref_dc = RESULTS.get(("decode", "numpy", bits, 1))
        for threads in THREADS:
            pf = RESULTS.get(("prefill", "cython", bits, threads))
            dc = RESULTS.get(("decode", "cython", bits, threads))
            if ref_pf and pf and ref_dc and dc:
                lines.append(f"|  | speed-up vs numpy | {threads} | ×{ref_pf / pf:,.0f} | ×{ref_dc / dc:,.0f} | |")
    table = "\n".join(lines)
    print("\n" + table)
    target = os.environ.get("NEEDLE_CY_BENCH_TABLE")
    if target:
        Path(target).write_text(table + "\n")
