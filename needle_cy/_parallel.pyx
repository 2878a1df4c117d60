# cython: language_level=3
"""OpenMP thread control in one place.

Every parallel kernel asks ``effective_threads`` how many threads to use; when
the build has no OpenMP the answer is always 1 and ``prange`` runs serially.
``barrier_check`` exercises and times the team barrier of ``parallel_barrier.h``;
``pf_stream_trace`` replays a prefetch stream's bookkeeping (``prefetch_stream.h``).
"""
import time

from cython.parallel cimport parallel, threadid
from libc.stdlib cimport malloc, free
from needle_cy._parallel cimport (nc_barrier, nc_barrier_init, nc_barrier_wait, nc_barrier_wait_pf, nc_team_barrier,
                                  nc_team_size, nc_pf_stream, nc_pf_clear, nc_pf_add, nc_pf_rewind, nc_pf_done,
                                  nc_pf_next, NC_PF_RANGES)

cdef extern from "csrc/omp_team.h":
    int nc_openmp_enabled() nogil
    int nc_omp_max_threads() nogil


def openmp_enabled():
    """True when the extensions were compiled with OpenMP."""
    return bool(nc_openmp_enabled())


def omp_max_threads():
    """Threads OpenMP would use by default (1 without OpenMP)."""
    return nc_omp_max_threads()


# ---------------------------------------------------------------------------
# the team barrier (parallel_barrier.h): a check and a timing, for tests/benchmarks



cdef inline void _meet(nc_barrier* bar, nc_pf_stream* pf, int omp) noexcept nogil:
    if omp:
        nc_team_barrier()
    else:
        nc_barrier_wait_pf(bar, pf)


cdef int _barrier_rounds(nc_barrier* bar, nc_pf_stream* pf, int* slots, int tid, int nt, int rounds,
                         int omp) noexcept nogil:
    """One thread's part of barrier_check: write this round into its slot, meet, read
    every slot (a thread that ran ahead or behind shows), meet again.  The count of
    wrong slots it saw.  With a prefetch stream (pf), each round consumes its phase
    so the waiters have lines to pump."""
    cdef int r, j, wrong = 0
    if pf != NULL:
        nc_pf_rewind(pf)
    for r in range(1, rounds + 1):
        slots[tid * 16] = r
        _meet(bar, pf, omp)
        for j in range(nt):
            if slots[j * 16] != r:
                wrong += 1
        _meet(bar, pf, omp)
        if pf != NULL:
            nc_pf_done(pf, r % 1024)
            if r % 1024 == 0:
                nc_pf_rewind(pf)
    return wrong


cdef void _barrier_member(nc_barrier* bar, nc_pf_stream* pfs, const char* arena, int* slots, int* wrong,
                          int* team, int rounds, int omp) noexcept nogil:
    """One team member of barrier_check (its own function: a Cython parallel block
    would share a local it only writes through a pointer)."""
    cdef int tid = threadid(), k
    cdef nc_pf_stream* pf = NULL
    if pfs != NULL:
        # 1024 phases of 4 KB each, in this thread's own 4 MB of the arena
        pf = pfs + tid
        nc_pf_clear(pf, 16384)
        for k in range(1024):
            nc_pf_add(pf, arena + (<Py_ssize_t>tid * 1024 + k) * 4096, 4096, k)
    if tid == 0:
        team[0] = nc_team_size()
        nc_barrier_init(bar, team[0])
    nc_team_barrier()
    wrong[tid] = _barrier_rounds(bar, pf, slots, tid, nc_team_size(), rounds, omp)


def barrier_check(int threads, int rounds, str kind="nc"):
    """Run ``rounds`` rounds of write / barrier / read-all / barrier on a team of
    ``threads`` with the engine's barrier (``kind="nc"``), the same with each waiter
    pumping a prefetch stream (``"nc_pf"``), or OpenMP's (``"omp"``).
    Returns (team size, slots seen out of step, seconds per barrier)."""
    if threads < 1 or rounds < 1:
        raise ValueError(f"barrier_check: threads and rounds must be >= 1, got {threads}, {rounds}")
    if kind not in ("nc", "nc_pf", "omp"):
        raise ValueError(f"barrier_check: kind must be 'nc', 'nc_pf' or 'omp', got {kind!r}")
    cdef int omp = kind == "omp"
    cdef nc_pf_stream* pfs = NULL
    cdef char* arena = NULL
    if kind == "nc_pf":
        pfs = <nc_pf_stream*>malloc(threads * sizeof(nc_pf_stream))
        arena = <char*>malloc(<Py_ssize_t>threads * 1024 * 4096 + 64)
        if pfs == NULL or arena == NULL:
            free(pfs); free(arena)
            raise MemoryError()
    cdef nc_barrier* bar = <nc_barrier*>malloc(sizeof(nc_barrier))
    cdef int* slots = <int*>malloc(16 * threads * sizeof(int))
    cdef int* wrong = <int*>malloc(threads * sizeof(int))
    cdef int* team = <int*>malloc(sizeof(int))
    cdef int i
    if bar == NULL or slots == NULL or wrong == NULL or team == NULL:
        free(bar); free(slots); free(wrong); free(team)
        raise MemoryError()
    for i in range(16 * threads):
        slots[i] = 0
    for i in range(threads):
        wrong[i] = 0
    t0 = time.perf_counter()
    with nogil, parallel(num_threads=threads):
        _barrier_member(bar, pfs, arena, slots, wrong, team, rounds, omp)
    seconds = (time.perf_counter() - t0) / (2 * rounds)
    n = team[0]
    bad = sum(wrong[i] for i in range(n))
    free(bar); free(slots); free(wrong); free(team); free(pfs); free(arena)
    return n, bad, seconds


def pf_stream_trace(ranges, long long ahead, script):
    """Replay a prefetch stream (prefetch_stream.h) over an arena, for tests.

    ranges: (offset, nbytes, phase) in the arena, added in order; script: ("next", k)
    asks for up to k lines, ("done", phase) consumes phases up to it, ("rewind",)
    starts over.  Returns, for each "next", the arena offsets of the lines handed out
    (fewer than k when none was due).  Adding more than NC_PF_RANGES ranges drops the
    rest, as the engine's plan would."""
    cdef Py_ssize_t top = 64
    for off, nbytes, phase in ranges:
        if off < 0 or nbytes < 0:
            raise ValueError(f"pf_stream_trace: range ({off}, {nbytes}) must not be negative")
        top = max(top, off + nbytes + 64)
    cdef nc_pf_stream* s = <nc_pf_stream*>malloc(sizeof(nc_pf_stream))
    cdef char* arena = <char*>malloc(top + 64)
    cdef char* base
    cdef const char* line
    if s == NULL or arena == NULL:
        free(s); free(arena)
        raise MemoryError()
    base = arena + (64 - (<Py_ssize_t>arena) % 64) % 64
    out = []
    try:
        nc_pf_clear(s, ahead)
        for off, nbytes, phase in ranges:
            nc_pf_add(s, base + <Py_ssize_t>off, nbytes, phase)
        for op in script:
            if op[0] == "next":
                got = []
                for _ in range(op[1]):
                    line = nc_pf_next(s)
                    if line == NULL:
                        break
                    got.append(<Py_ssize_t>(line - base))
                out.append(got)
            elif op[0] == "done":
                nc_pf_done(s, op[1])
            elif op[0] == "rewind":
                nc_pf_rewind(s)
            else:
                raise ValueError(f"pf_stream_trace: unknown step {op!r}")
    finally:
        free(s)
        free(arena)
    return out
