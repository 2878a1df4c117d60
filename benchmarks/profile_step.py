"""Where a multi-thread decode step's wall time goes, meeting by meeting.

A step on several threads runs in one parallel region whose threads meet at a barrier
between dependent operations (``_step_blocks`` in ``needle_cy/_model.pyx``).  A build
with the meeting profile records, per thread and per meeting, the time worked before it
and the time waited in it; this script names the meetings and prints them per phase of
a block (the mean over the blocks), per engram site and for the head:

    touch needle_cy/_model.pyx && CFLAGS=-DNC_BARRIER_PROFILE NEEDLE_CY_BUILD_ONLY=_model \\
        python setup.py build_ext --inplace
    python benchmarks/profile_step.py 2 64 300         # BITS CONTEXT STEPS [THREADS] [ARCHIVE]
    touch needle_cy/_model.pyx && NEEDLE_CY_BUILD_ONLY=_model python setup.py build_ext --inplace

A thread's "work" is everything it did between two meetings (the serial steps on thread
0, its share of the products, the pools on the last thread); "wait" is its time in the
barrier, i.e. how long the slowest thread kept it.  Use a quiet machine: a descheduled
thread shows as the other's wait.  The default archive is bench_model.py's random
full-size model at BITS.
"""
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from needle_cy import _model  # noqa: E402
from needle_cy.model import Model  # noqa: E402

# meetings of one block, in _step_blocks' order: what happened before each one (a team
# smaller than mlp_team_min(), so the MLP runs on thread 0 without meetings of its own)
BLOCK_PHASES = [
    "router input, Φ, router weights, block input (t0) | pools (last)",
    "q/k/v/gate products",
    "conv, RoPE, cache, attention (KV heads)",
    "gate, A8, out products (each thread its own gate)",
    "MLP input, Monarch MLP, lane update (t0) | engram site parts (last)",
]
SITE_PHASES = ["site input (t0) | previous value conv (last)", "key/value products"]


def phase_table(ns, steps, n_sites, n_layers, threads, extra0=0):
    """Rows (name, [work, wait] per thread in µs per step), one per phase; ``extra0``:
    the meeting block 0 adds where it reads an engram site (engram_sites holds 0);
    n_sites: the sites with phases of their own before block 0 (0 where the last thread
    runs them beside thread 0's MLPs: CythonEngine.sites_late)."""
    us = ns[:threads].astype(np.float64) / 1e3 / max(steps, 1)     # [threads, meetings, 2]
    rows = []
    k = 0
    for s in range(n_sites):
        for name in SITE_PHASES:
            rows.append((f"engram site {s}: {name}", us[:, k]))
            k += 1
    first_block = k
    per_block = len(BLOCK_PHASES)
    for i, name in enumerate(BLOCK_PHASES):
        # block 0's first phase also holds the last site's value conv: blocks 1.. only
        idx = [first_block + extra0 + per_block * b + i for b in range(1, n_layers)] or [first_block + i]
        rows.append((f"block (mean of {len(idx)}): {name}", us[:, idx].mean(axis=1)))
    k = first_block + extra0 + per_block * n_layers
    rows.append(("final norm (t0), head rotation wait", us[:, k]))
    rows.append(("head products, last pools (each thread a part)", us[:, k + 1]))
    return rows, us


def main(argv):
    bits = int(argv[1]) if len(argv) > 1 else 2
    context = int(argv[2]) if len(argv) > 2 else 64
    steps = int(argv[3]) if len(argv) > 3 else 300
    threads = int(argv[4]) if len(argv) > 4 else 2
    if len(argv) > 5:
        path = argv[5]
    else:
        from bench_model import archive_path
        path = archive_path(bits)
    if threads >= _model.mlp_team_min():
        raise SystemExit(f"{threads} threads split the MLP (NEEDLE_CY_MLP_TEAM={_model.mlp_team_min()}): "
                         "its meetings are not named here")
    m = Model.load(path, threads=threads)
    cfg = m.config
    ids = np.random.default_rng(0).integers(4, min(16000, m.vocab_size), size=context + steps + 8)
    m.prefill(ids[:context])
    for t in ids[context:context + 8]:              # warm-up steps, not counted
        m.step(int(t))
    _model.barrier_profile()
    t0 = time.perf_counter()
    for t in ids[context + 8:]:
        m.step(int(t))
    wall = (time.perf_counter() - t0) / steps
    ns, n = _model.barrier_profile()
    if n != steps:
        raise SystemExit(f"profiled {n} regions for {steps} steps: is threads > 1 and the model a full one?")
    own_sites = 0 if m.engine.sites_late else cfg.num_engram_sites
    rows, us = phase_table(ns, n, own_sites, cfg.num_layers, threads,
                           extra0=int(0 in tuple(cfg.engram_sites)))
    print(f"decode {bits}-bit after {context}, {threads} threads: {wall * 1e6:.0f} µs a step wall "
          f"({1 / wall:.0f} tok/s), {us[0].sum():.0f} µs in the region on thread 0")
    head = " | ".join(f"t{t} work  wait" for t in range(threads))
    print(f"{'µs a step (block rows: a block)':66s} {head}")
    for name, v in rows:
        cells = " | ".join(f"{v[t, 0]:7.2f} {v[t, 1]:5.2f}" for t in range(threads))
        print(f"{name:66s} {cells}")
    for t in range(threads):
        print(f"thread {t}: work {us[t, :, 0].sum():.0f} µs, waiting {us[t, :, 1].sum():.0f} µs a step")


if __name__ == "__main__":
    main(sys.argv)
