# cython: language_level=3
"""OpenMP thread control in one place.

Every parallel kernel asks ``effective_threads`` how many threads to use; when
the build has no OpenMP the answer is always 1 and ``prange`` runs serially.
"""

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
