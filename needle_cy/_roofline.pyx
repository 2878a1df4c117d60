# cython: language_level=3
"""Roofline probes: this machine's peak compute and read bandwidth, measured by native loops.

The benchmark report (``benchmarks/report.py``) divides each measured speed by the ceiling
these give, so they are measured in the same run and on the same build as the engine:

* ``compute_peak(kind, threads, seconds)``: multiply-accumulates per second of one
  instruction kind run back to back on independent accumulators — ``"fma"`` (float32
  FMA), ``"int8"`` (8-bit dot products: VNNI ``vpdpbusd``, else ``vpmaddubsw`` +
  ``vpmaddwd``; NEON ``sdot``), ``"int16"`` (``vpdpwssd`` / ``vpmaddwd``: what the exact
  integer CQ kernels use).  ``compute_isa(kind)`` names the instruction this build uses.
* ``read_bandwidth(buffer, threads, seconds)``: bytes per second of summing a buffer's
  64-bit words, each thread its own contiguous share; the buffer's size decides which
  memory level is measured (a few hundred KB: L2, a few MB: L3, hundreds of MB: DRAM).

The loops live in ``roofline_probes.h`` behind each ISA's macros, with portable C
fallbacks.  There is no NumPy reference for this module: it computes nothing the model
needs, only how fast this CPU does it.  Each probe repeats its call until ``seconds`` have
passed (best of three such batches) and reports the fastest batch.

``timer="cpu"`` (the default) divides the work by the process's CPU time per thread
(``time.process_time() / threads``): on a shared machine that is the rate of a core the
process had to itself, the ceiling an idle machine would give.  ``timer="wall"`` uses
``time.perf_counter``: what this run got, other tenants included.
"""
import time

cimport cython
from libc.stdint cimport int64_t, uint64_t

cdef extern from "csrc/roofline_probes.h":
    const char* nc_rf_fma_isa()
    const char* nc_rf_int8_isa()
    const char* nc_rf_int16_isa()
    double nc_rf_compute(int kind, int64_t iters, int threads, double* checksum) nogil
    uint64_t nc_rf_read(const unsigned char* buf, size_t n_bytes, int64_t reps, int threads,
                        double* bytes_read) nogil

_KINDS = {"fma": 0, "int8": 1, "int16": 2}


def compute_isa(kind):
    """The instruction the ``kind`` probe runs in this build."""
    code = _kind(kind)
    name = (nc_rf_fma_isa, nc_rf_int8_isa, nc_rf_int16_isa)[code]()
    return name.decode()


def _kind(kind):
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    return _KINDS[kind]


def _threads(threads):
    t = int(threads)
    if t < 1:
        raise ValueError(f"threads must be >= 1, got {threads!r}")
    return t


def _seconds(seconds):
    s = float(seconds)
    if not s > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    return s


def _clock(timer, nthreads):
    if timer == "wall":
        return time.perf_counter
    if timer == "cpu":
        return lambda: time.process_time() / nthreads
    raise ValueError(f"timer must be 'cpu' or 'wall', got {timer!r}")


def _best_rate(run, int64_t start, double budget, clock):
    """Work per second of ``run(n)`` (one native call of size n, returning its work).
    n doubles from ``start`` until one call takes at least budget/10 of wall time (so a
    parallel region's fork/join and a sleeping thread's wake-up are a small part of each
    call, and the first touch of the memory is behind us); then three batches of calls,
    each at least ``budget`` on ``clock``, and the fastest batch."""
    cdef int64_t n = start
    while True:
        w0 = time.perf_counter()
        run(n)
        if time.perf_counter() - w0 >= budget / 10 or n >= (<int64_t>1) << 40:
            break
        n *= 2
    best = 0.0
    for _ in range(3):
        t0 = clock()
        done = 0.0
        while True:
            done += run(n)
            now = clock()
            if now - t0 >= budget:
                break
        best = max(best, done / (now - t0))
    return best


cdef double _compute_call(int code, int64_t iters, int nthreads):
    cdef double checksum = 0.0, macs
    with nogil:
        macs = nc_rf_compute(code, iters, nthreads, &checksum)
    return macs


cdef double _read_call(const unsigned char[::1] buffer, int64_t reps, int nthreads):
    cdef double bytes_read = 0.0
    with nogil:
        nc_rf_read(&buffer[0], buffer.shape[0], reps, nthreads, &bytes_read)
    return bytes_read


def compute_peak(kind, threads=1, seconds=0.05, timer="cpu"):
    """Multiply-accumulates per second (all threads together) of the ``kind`` probe."""
    cdef int code = _kind(kind)
    cdef int nthreads = _threads(threads)
    cdef double budget = _seconds(seconds)
    clock = _clock(timer, nthreads)
    return _best_rate(lambda iters: _compute_call(code, iters, nthreads), 1000, budget, clock)


@cython.boundscheck(True)
def read_bandwidth(const unsigned char[::1] buffer, threads=1, seconds=0.05, timer="cpu"):
    """Bytes per second read from ``buffer`` (64-byte aligned, >= 256 bytes per thread)."""
    cdef int nthreads = _threads(threads)
    cdef double budget = _seconds(seconds)
    clock = _clock(timer, nthreads)
    cdef size_t n = buffer.shape[0]
    if n < <size_t>256 * nthreads:
        raise ValueError(f"buffer of {n} bytes is below 256 bytes per thread")
    if (<size_t>&buffer[0]) % 64:
        raise ValueError("buffer must be 64-byte aligned")
    return _best_rate(lambda reps: _read_call(buffer, reps, nthreads), 1, budget, clock)
