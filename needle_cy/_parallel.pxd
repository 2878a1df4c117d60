# The OpenMP primitives a caller's own parallel region needs (one place for them,
# like the thread counts in _parallel.pyx).  Without OpenMP a "team" is the calling
# thread alone: the size is 1 and a barrier does nothing, so code written for a
# team runs serially, unchanged.

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    /* An orphaned barrier: it binds to the innermost enclosing parallel region at run
       time (a team of one outside any), so every thread of the team must reach it. */
    static inline void nc_team_barrier(void) {
    #pragma omp barrier
    }
    static inline int nc_team_size(void) { return omp_get_num_threads(); }
    #else
    static inline void nc_team_barrier(void) {}
    static inline int nc_team_size(void) { return 1; }
    #endif
    """
    void nc_team_barrier() noexcept nogil
    int nc_team_size() noexcept nogil


# The engine's own team barrier (parallel_barrier.h: bounded spin on a generation
# counter, then a futex; no system call when nobody sleeps).  One nc_barrier per
# region, initialised by one thread for the team's size before any thread waits.
cdef extern from "parallel_barrier.h":
    ctypedef struct nc_barrier:
        int total
        int spins
    void nc_barrier_init(nc_barrier* b, int total) noexcept nogil
    void nc_barrier_wait(nc_barrier* b) noexcept nogil
    int nc_barrier_spins_from_env() noexcept nogil
    # the opt-in meeting profile (CFLAGS=-DNC_BARRIER_PROFILE; no-ops otherwise)
    enum: NC_PROF_THREADS
    enum: NC_PROF_MEETINGS
    void nc_prof_begin(int tid) noexcept nogil
    void nc_prof_end() noexcept nogil
    long long nc_prof_read(long long* out) noexcept nogil
