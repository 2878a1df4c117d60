# cython: language_level=3
"""OpenMP thread control in one place.

Every parallel kernel asks ``effective_threads`` how many threads to use; when
the build has no OpenMP the answer is always 1 and ``prange`` runs serially.
``barrier_check`` exercises and times the team barrier of ``parallel_barrier.h``.
"""
import time

from cython.parallel cimport parallel, threadid
from libc.stdlib cimport malloc, free
from needle_cy._parallel cimport nc_barrier, nc_barrier_init, nc_barrier_wait, nc_team_barrier, nc_team_size

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int nc_openmp_enabled(void) { return 1; }
    static int nc_omp_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int nc_openmp_enabled(void) { return 0; }
    static int nc_omp_max_threads(void) { return 1; }
    #endif
    """
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



cdef int _barrier_rounds(nc_barrier* bar, int* slots, int tid, int nt, int rounds, int omp) noexcept nogil:
    """One thread's part of barrier_check: write this round into its slot, meet, read
    every slot (a thread that ran ahead or behind shows), meet again.  The count of
    wrong slots it saw."""
    cdef int r, j, wrong = 0
    for r in range(1, rounds + 1):
        slots[tid * 16] = r
        if omp:
            nc_team_barrier()
        else:
            nc_barrier_wait(bar)
        for j in range(nt):
            if slots[j * 16] != r:
                wrong += 1
        if omp:
            nc_team_barrier()
        else:
            nc_barrier_wait(bar)
    return wrong


cdef void _barrier_member(nc_barrier* bar, int* slots, int* wrong, int* team, int rounds,
                          int omp) noexcept nogil:
    """One team member of barrier_check (its own function: a Cython parallel block
    would share a local it only writes through a pointer)."""
    cdef int tid = threadid()
    if tid == 0:
        team[0] = nc_team_size()
        nc_barrier_init(bar, team[0])
    nc_team_barrier()
    wrong[tid] = _barrier_rounds(bar, slots, tid, nc_team_size(), rounds, omp)


def barrier_check(int threads, int rounds, str kind="nc"):
    """Run ``rounds`` rounds of write / barrier / read-all / barrier on a team of
    ``threads`` with the engine's barrier (``kind="nc"``) or OpenMP's (``"omp"``).
    Returns (team size, slots seen out of step, seconds per barrier)."""
    if threads < 1 or rounds < 1:
        raise ValueError(f"barrier_check: threads and rounds must be >= 1, got {threads}, {rounds}")
    if kind not in ("nc", "omp"):
        raise ValueError(f"barrier_check: kind must be 'nc' or 'omp', got {kind!r}")
    cdef int omp = kind == "omp"
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
        _barrier_member(bar, slots, wrong, team, rounds, omp)
    seconds = (time.perf_counter() - t0) / (2 * rounds)
    n = team[0]
    bad = sum(wrong[i] for i in range(n))
    free(bar); free(slots); free(wrong); free(team)
    return n, bad, seconds
