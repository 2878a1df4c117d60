"""Per-operator profile of whole-model decode or prefill, with Linux ``perf``.

Only the measured part is recorded: perf starts disabled and this script enables
it through perf's control FIFO around the timed loop (the model load and the
prompt that builds the context are left out).

    mkfifo /tmp/perf.ctl /tmp/perf.ack
    PERF_CTL=/tmp/perf.ctl PERF_CTL_ACK=/tmp/perf.ack NEEDLE_CY_THREADS=1 perf record -F 4000 \\
        -o /tmp/decode.data --control fifo:/tmp/perf.ctl,/tmp/perf.ack -D -1 -- \\
        python benchmarks/profile_model.py decode 4 600 100
    perf report -i /tmp/decode.data --no-children --sort symbol --stdio | head -30

Arguments: ``decode BITS CONTEXT STEPS`` (STEPS ``step`` calls after a CONTEXT-token
prompt) or ``prefill BITS TOKENS ROUNDS``, then optionally an archive path;
NEEDLE_CY_CQ_KERNEL picks the CQ kernel.  The default archive is bench_model.py's random
full-size model at BITS.  ``benchmarks/report.py`` runs this under perf and groups the symbols.  Each CQ operator class is
its own symbol: ``nc_cqi_rows_*`` (integer matvec), ``nc_cqi_mm_rows_*`` (integer
matmul), ``nc_cql_rows_*``/``nc_cql_tile_rows_*`` (2-bit lookups; vnni or bw) and ``nc_cql_tables``/``nc_cql_token_scale``/
``nc_cql_tile_tables`` (their tables), ``nc_cq_avx2_rows_dot``/``nc_cq_dot_tiles`` (float), ``nc_attend_avx2``
(attention), ``nc_kron_half``/``monarch_mlp_c`` (MLP), ``nc_cqi_a8_codes_*`` and
``nc_cq_fwht_avx2`` (rotations).  Without PERF_CTL it only prints the CPU time.
"""
import os
import sys
import time
from pathlib import Path

import numpy as np

# this checkout's needle_cy (not an installed one), and bench_model beside this file
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
from bench_model import archive_path  # noqa: E402

from needle_cy.model import Model  # noqa: E402
import needle_cy  # noqa: E402


def _perf(command):
    """Send perf a control command; with PERF_CTL_ACK (perf's ack FIFO) wait until perf has
    acted on it, so the samples stop before the code after the timed loop runs (without
    the wait, interpreter shutdown of a short run got recorded)."""
    ctl = os.environ.get("PERF_CTL")
    if ctl:
        with open(ctl, "w") as f:
            f.write(command + "\n")
        ack = os.environ.get("PERF_CTL_ACK")
        if ack:
            with open(ack) as f:
                f.readline()


def main(argv):
    kind, bits, n, reps = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    print(f"needle_cy from {Path(needle_cy.__file__).parent}")
    path = argv[4] if len(argv) > 4 else archive_path(bits)
    # one thread unless NEEDLE_CY_THREADS names more (a 2-thread profile of the one-region step)
    m = Model.load(path, backend="cython", threads=int(os.environ.get("NEEDLE_CY_THREADS", "1")))
    ids = np.random.default_rng(0).integers(4, min(16000, m.vocab_size), size=n + (reps if kind == "decode" else 0))
    if kind == "decode":
        m.prefill(ids[:n])
        _perf("enable")
        t0 = time.process_time()
        for t in ids[n:]:
            m.step(int(t))
        seconds = (time.process_time() - t0) / reps
        _perf("disable")
        print(f"decode {bits}-bit after {n}: {seconds * 1e3:.2f} ms/step CPU ({1 / seconds:.1f} tok/s)")
    else:
        m.prefill(ids[:min(64, n)])
        best = float("inf")
        _perf("enable")
        for _ in range(reps):
            m.reset()
            t0 = time.process_time()
            m.prefill(ids)
            best = min(best, time.process_time() - t0)
        _perf("disable")
        print(f"prefill {bits}-bit {n} tokens: {best * 1e3:.1f} ms CPU ({n / best:.1f} tok/s)")


if __name__ == "__main__":
    main(sys.argv[1:])
