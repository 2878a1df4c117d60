# The OpenMP primitives a caller's own parallel region needs (one place for them,
# like the thread counts in _parallel.pyx).  Without OpenMP a "team" is the calling
# thread alone: the size is 1 and a barrier does nothing, so code written for a
# team runs serially, unchanged.

cdef extern from "csrc/omp_team.h":
    void nc_team_barrier() noexcept nogil
    int nc_team_size() noexcept nogil


# A thread's prefetch stream: the byte ranges it reads next, asked for into its L2 while
# it waits at a meeting (prefetch_stream.h; the plan changes timing only).
cdef extern from "csrc/prefetch_stream.h":
    ctypedef struct nc_pf_stream:
        int n
        long long ahead
    void nc_pf_clear(nc_pf_stream* s, long long ahead) noexcept nogil
    void nc_pf_add(nc_pf_stream* s, const void* p, long long nbytes, int phase) noexcept nogil
    void nc_pf_rewind(nc_pf_stream* s) noexcept nogil
    void nc_pf_done(nc_pf_stream* s, int phase) noexcept nogil
    const char* nc_pf_next(nc_pf_stream* s) noexcept nogil
    enum: NC_PF_RANGES


# The engine's own team barrier (parallel_barrier.h: bounded spin on a generation
# counter, then a futex; no system call when nobody sleeps).  One nc_barrier per
# region, initialised by one thread for the team's size before any thread waits.
cdef extern from "csrc/parallel_barrier.h":
    ctypedef struct nc_barrier:
        int total
        int spins
    void nc_barrier_init(nc_barrier* b, int total) noexcept nogil
    void nc_barrier_wait(nc_barrier* b) noexcept nogil
    # a meeting whose waiter pumps its prefetch stream (prefetch_stream.h) while it waits
    void nc_barrier_wait_pf(nc_barrier* b, nc_pf_stream* pf) noexcept nogil
    int nc_barrier_spins_from_env() noexcept nogil
    # the opt-in meeting profile (CFLAGS=-DNC_BARRIER_PROFILE; no-ops otherwise)
    enum: NC_PROF_THREADS
    enum: NC_PROF_MEETINGS
    void nc_prof_begin(int tid) noexcept nogil
    void nc_prof_end() noexcept nogil
    long long nc_prof_read(long long* out) noexcept nogil
