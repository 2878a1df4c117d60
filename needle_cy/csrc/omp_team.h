/* OpenMP behind one door: the team primitives a caller's own parallel region needs
   (declared in _parallel.pxd for every module that cimports it) and whether the build
   has OpenMP at all (_parallel.pyx).  Without OpenMP a "team" is the calling thread
   alone: its size is 1 and a barrier does nothing, so code written for a team runs
   serially, unchanged. */
#ifndef NEEDLE_CY_OMP_TEAM_H
#define NEEDLE_CY_OMP_TEAM_H

#ifdef _OPENMP
#include <omp.h>
/* An orphaned barrier: it binds to the innermost enclosing parallel region at run
   time (a team of one outside any), so every thread of the team must reach it. */
static inline void nc_team_barrier(void) {
#pragma omp barrier
}
static inline int nc_team_size(void) { return omp_get_num_threads(); }
static inline int nc_openmp_enabled(void) { return 1; }
static inline int nc_omp_max_threads(void) { return omp_get_max_threads(); }
#else
static inline void nc_team_barrier(void) {}
static inline int nc_team_size(void) { return 1; }
static inline int nc_openmp_enabled(void) { return 0; }
static inline int nc_omp_max_threads(void) { return 1; }
#endif

#endif  /* NEEDLE_CY_OMP_TEAM_H */
