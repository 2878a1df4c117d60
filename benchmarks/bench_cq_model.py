"""Whole-model speed with each CQ kernel, side by side in one run (pytest-benchmark).

    NEEDLE_CY_THREADS=1 pytest benchmarks/bench_cq_model.py --benchmark-timer=time.process_time \
        --benchmark-columns=min,median,rounds
    NEEDLE_CY_BENCH_TABLE=/tmp/t.md ...            (also writes the tokens/s table)
    NEEDLE_CY_BENCH_BITS=4 NEEDLE_CY_BENCH_KERNELS=avx2,avx512bw,auto ...

The archive is bench_model.py's random full-size model (20 layers, d 768, vocab
16384) in deploy numerics, one thread.  For every width the kernels run one after
the other, each on the model loaded while it was in force (``_cq.set_kernel``, the
run-time switch that ``NEEDLE_CY_CQ_KERNEL`` sets at import; the engine makes the
lookup layouts of the lookup kernel in force at load): ``avx2`` is the float kernel
on every product, ``auto`` the best this CPU has (on AVX-512 CPUs the lookups and
the integer kernels, on AVX2 ones the AVX2 lookups and the float kernel).

* ``decode``: 16 ``step`` calls after a prompt of 64 or 600 tokens (state restored
  from a snapshot before every round, outside the timing);
* ``prefill``: a 600-token prompt on a fresh state (chunks of 64 tokens).

Kernels are the innermost parameter, so the runs that are compared are adjacent.
"""
import os
from pathlib import Path

import numpy as np
import pytest

from needle_cy import _cq
from needle_cy.model import Model

from bench_model import archive_path

BITS = [int(b) for b in os.environ.get("NEEDLE_CY_BENCH_BITS", "2,4").split(",")]
KERNELS = [k for k in os.environ.get("NEEDLE_CY_BENCH_KERNELS", "avx2,auto").split(",")
           if k == "auto" or k in _cq.available_kernels()]
CONTEXTS = [64, 600]
PROMPT = 600
DECODE_STEPS = 16
RESULTS = {}   # (kind, bits, context, kernel) -> seconds (minimum)

_models = {}


def model(bits, kernel):
    """The model at this width, loaded under `kernel` (in force: the engine lays its
    matrices out for the lookup kernel in force at load, so each kernel has its own)."""
    if (bits, kernel) not in _models:
        _models[bits, kernel] = Model.load(archive_path(bits), backend="cython", threads=1)
    return _models[bits, kernel]


def ids():
    return np.random.default_rng(0).integers(4, 16000, size=PROMPT + DECODE_STEPS)


@pytest.fixture
def kernel(request):
    _cq.set_kernel(request.param)
    yield request.param
    _cq.set_kernel("auto")


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("bits", BITS)
def test_decode(benchmark, bits, context, kernel):
    m = model(bits, kernel)
    seq = ids()
    m.reset()
    m.prefill(seq[:context])
    snap = m.snapshot()
    steps = [int(t) for t in seq[context:context + DECODE_STEPS]]

    def run():
        for t in steps:
            m.step(t)

    benchmark.pedantic(run, setup=lambda: m.restore(snap), rounds=7, iterations=1)
    RESULTS[("decode", bits, context, kernel)] = benchmark.stats.stats.min
    benchmark.extra_info["tokens_per_s"] = DECODE_STEPS / benchmark.stats.stats.min


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
@pytest.mark.parametrize("bits", BITS)
def test_prefill(benchmark, bits, kernel):
    m = model(bits, kernel)
    prompt = ids()[:PROMPT]

    def run():
        m.reset()
        return m.prefill(prompt)

    benchmark.pedantic(run, rounds=3, iterations=1)
    RESULTS[("prefill", bits, PROMPT, kernel)] = benchmark.stats.stats.min
    benchmark.extra_info["tokens_per_s"] = PROMPT / benchmark.stats.stats.min


def test_write_table():
    """The side-by-side table (written to NEEDLE_CY_BENCH_TABLE when set)."""
    if not RESULTS:
        pytest.skip("no benchmark ran")
    head = " | ".join(f"{k} tok/s" for k in KERNELS)
    lines = [f"| width | what | {head} | {KERNELS[-1]} / {KERNELS[0]} |",
             "|---|---|" + "---|" * (len(KERNELS) + 1)]
    rows = [("decode", c, f"decode after {c}") for c in CONTEXTS] + [("prefill", PROMPT, f"prefill {PROMPT}")]
    for bits in BITS:
        for kind, ctx, label in rows:
            secs = [RESULTS.get((kind, bits, ctx, k)) for k in KERNELS]
            if not all(secs):
                continue
            n = DECODE_STEPS if kind == "decode" else PROMPT
            cells = " | ".join(f"{n / s:,.1f}" for s in secs)
            lines.append(f"| {bits}-bit | {label} | {cells} | {secs[0] / secs[-1]:.2f}× |")
    table = "\n".join(lines)
    print("\n" + table)
    target = os.environ.get("NEEDLE_CY_BENCH_TABLE")
    if target:
        Path(target).write_text(table + "\n")
