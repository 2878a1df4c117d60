/* A team barrier for the engine's own parallel regions (needle_cy/_parallel.pxd).
 *
 * Why not `#pragma omp barrier`: a decode step of the full-size model meets at ~320
 * barriers, and libgomp's last arriving thread calls futex_wake at every one of them,
 * sleeper or not (a system call of 0.5-1 us in a VM, on the critical path: the last
 * thread to arrive is the one that had the serial work).  Here the waiters spin on a
 * generation counter for a bounded number of pauses, then sleep on a futex; the last
 * arriver wakes the futex only when a waiter has said it sleeps.
 *
 * Memory order: each arrival is an acq_rel read-modify-write of `arrived` (they form
 * one release sequence), the last arriver publishes the new generation with a release
 * store after that, and a waiter leaves on an acquire load of it; so every write
 * made before the barrier by any thread is visible after it to every thread.
 * `sleepers` and the generation are read and written sequentially consistent, so a
 * waiter that announces it sleeps either sees the new generation or is woken.
 *
 * Where futexes are missing (not Linux) a waiter past its spins yields the CPU in a
 * loop instead of sleeping.  Without OpenMP the team is one thread and nothing waits.
 */
#ifndef NEEDLE_CY_PARALLEL_BARRIER_H
#define NEEDLE_CY_PARALLEL_BARRIER_H

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "prefetch_stream.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NC_HAVE_FUTEX 1
#else
#include <sched.h>
#define NC_HAVE_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NC_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define NC_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define NC_CPU_RELAX() do {} while (0)
#endif

/* each counter on its own cache line: the arrivals, the generation the waiters
   poll, and the sleepers are written by different threads at different times */
typedef struct {
    int total;                 /* threads in the team */
    int spins;                 /* pauses a waiter polls before it sleeps */
    char _pad0[56];
    int arrived;
    char _pad1[60];
    int generation;
    char _pad2[60];
    int sleepers;
    char _pad3[60];
} nc_barrier;

/* The spin budget follows the OpenMP wait policy of the process, read at every
   nc_barrier_init (once a decode step, ~0.1 us against the step's ~2 ms), so a change
   of the environment takes effect at the next step:
   OMP_WAIT_POLICY=passive sleeps at once, =active spins (nearly) forever, otherwise
   GOMP_SPINCOUNT pauses (needle_cy/__init__.py sets 20000, ~0.5 ms; libgomp reads
   the same variables for its own waits). */
static inline int nc_barrier_spins_from_env(void) {
    const char* policy = getenv("OMP_WAIT_POLICY");
    const char* count = getenv("GOMP_SPINCOUNT");
    long n;
    char* end;
    if (policy != NULL && (policy[0] == 'p' || policy[0] == 'P'))    /* passive */
        return 0;
    if (policy != NULL && (policy[0] == 'a' || policy[0] == 'A'))    /* active */
        return INT_MAX;
    if (count != NULL && *count != '\0') {
        n = strtol(count, &end, 10);
        if (end != count && n >= 0)
            return n > INT_MAX ? INT_MAX : (int)n;
    }
    return 20000;
}

/* Called by one thread while no thread is waiting (before the others use it). */
static inline void nc_barrier_init(nc_barrier* b, int total) {
    memset(b, 0, sizeof(*b));
    b->total = total;
    b->spins = nc_barrier_spins_from_env();
}

static inline void nc_barrier_sleep(int* addr, int seen) {
#if NC_HAVE_FUTEX
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)addr; (void)seen;
    sched_yield();
#endif
}

static inline void nc_barrier_wake(int* addr) {
#if NC_HAVE_FUTEX
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

#if !(defined(__GNUC__) || defined(__clang__))
/* no GNU atomics (MSVC): the OpenMP barrier of the enclosing region */
static inline void nc_barrier_wait_impl(nc_barrier* b, nc_pf_stream* pf) {
    (void)pf;
    if (b->total <= 1)
        return;
#ifdef _OPENMP
#pragma omp barrier
#endif
}
#else
static inline void nc_barrier_wait_impl(nc_barrier* b, nc_pf_stream* pf) {
    int gen, i;
    if (b->total <= 1)
        return;
    /* stable until this thread arrives: the generation moves only when all have */
    gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == b->total) {
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);   /* ordered by the next store */
        __atomic_store_n(&b->generation, (int)((unsigned)gen + 1u), __ATOMIC_SEQ_CST);   /* wraps */
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST) > 0)
            nc_barrier_wake(&b->generation);
        return;
    }
    /* first the waiter's prefetch stream, if it has one (prefetch_stream.h): one line
       a poll while lines are due, then the pauses the spin budget counts */
    while (nc_pf_pump(pf)) {
        if (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) != gen)
            return;
    }
    for (i = 0; i < b->spins; i++) {
        if (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) != gen)
            return;
        NC_CPU_RELAX();
    }
    __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&b->generation, __ATOMIC_SEQ_CST) == gen)
        nc_barrier_sleep(&b->generation, gen);
    __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
}
#endif

/* ---- an opt-in profile of the meetings: build with CFLAGS=-DNC_BARRIER_PROFILE ----
   For each thread of a profiled region (nc_prof_begin .. nc_prof_end) and each meeting
   k, its k-th nc_barrier_wait since nc_prof_begin: the wall time it worked before the
   meeting and the time it waited in it, in ns, summed over the regions profiled, read
   and reset by nc_prof_read.  A decode step meets in the same order every time, so
   meeting k is one place of the step (benchmarks/profile_step.py names them).  The
   counters belong to the file that includes this header and calls nc_prof_begin
   (_model.pyx; the Monarch MLP's meetings in _ops.pyx count as work).  Without the
   flag the calls do nothing and nc_prof_read returns -1. */
#define NC_PROF_THREADS 8
#define NC_PROF_MEETINGS 1024
#ifdef NC_BARRIER_PROFILE
#include <time.h>
static __thread int nc_prof_tid = -1;
static __thread int nc_prof_k = 0;
static __thread long long nc_prof_t = 0;
static long long nc_prof_ns[NC_PROF_THREADS][NC_PROF_MEETINGS][2];
static long long nc_prof_regions = 0;
static inline long long nc_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static inline void nc_prof_begin(int tid) {
    if (tid < 0 || tid >= NC_PROF_THREADS)
        return;
    if (tid == 0)
        nc_prof_regions++;
    nc_prof_tid = tid;
    nc_prof_k = 0;
    nc_prof_t = nc_prof_now();
}
static inline void nc_prof_end(void) {
    if (nc_prof_tid >= 0 && nc_prof_k < NC_PROF_MEETINGS)
        nc_prof_ns[nc_prof_tid][nc_prof_k][0] += nc_prof_now() - nc_prof_t;
    nc_prof_tid = -1;
}
static inline void nc_barrier_wait_pf(nc_barrier* b, nc_pf_stream* pf) {
    long long t0, t1;
    if (nc_prof_tid < 0 || nc_prof_k >= NC_PROF_MEETINGS) {
        nc_barrier_wait_impl(b, pf);
        return;
    }
    t0 = nc_prof_now();
    nc_barrier_wait_impl(b, pf);
    t1 = nc_prof_now();
    nc_prof_ns[nc_prof_tid][nc_prof_k][0] += t0 - nc_prof_t;
    nc_prof_ns[nc_prof_tid][nc_prof_k][1] += t1 - t0;
    nc_prof_t = t1;
    nc_prof_k++;
}
/* out[(t·NC_PROF_MEETINGS + k)·2 + {0: work, 1: wait}] for t < NC_PROF_THREADS; returns
   the regions profiled and resets (call it outside any profiled region) */
static inline long long nc_prof_read(long long* out) {
    long long n = nc_prof_regions;
    memcpy(out, nc_prof_ns, sizeof(nc_prof_ns));
    memset(nc_prof_ns, 0, sizeof(nc_prof_ns));
    nc_prof_regions = 0;
    return n;
}
#else
static inline void nc_prof_begin(int tid) { (void)tid; }
static inline void nc_prof_end(void) {}
static inline void nc_barrier_wait_pf(nc_barrier* b, nc_pf_stream* pf) { nc_barrier_wait_impl(b, pf); }
static inline long long nc_prof_read(long long* out) { (void)out; return -1; }
#endif

/* a meeting with no prefetch stream to pump */
static inline void nc_barrier_wait(nc_barrier* b) { nc_barrier_wait_pf(b, NULL); }

#endif
