# The OpenMP primitives a caller's own parallel region needs (one place for them,
# like the thread counts in _parallel.pyx).  Without OpenMP a "team" is the calling
# thread alone: the size is 1 and a barrier does nothing, so code written for a
# team runs serially, unchanged.

from libc.stdint cimport int64_t

cdef extern from *:
    """
    #include <stdint.h>
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
    /* The next ticket of a counter shared by a team (its old value; relaxed order: a
       ticket only hands out work, the barriers around a phase order the data). */
    static inline int64_t nc_ticket(int64_t* counter) {
        return __atomic_fetch_add(counter, (int64_t)1, __ATOMIC_RELAXED);
    }
    """
    void nc_team_barrier() noexcept nogil
    int nc_team_size() noexcept nogil
    int64_t nc_ticket(int64_t* counter) noexcept nogil
