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
