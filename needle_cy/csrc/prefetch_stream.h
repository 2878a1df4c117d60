/* A thread's prefetch stream: the bytes it will read next, asked for while it waits.
 *
 * Why.  A decode step streams every weight from DRAM once, and a one-token product is
 * bound by that stream (the lookup kernel reads rows from DRAM at roughly half the rate
 * it reads rows already in L2; benchmarks/history/model.md).  Between the products (attention,
 * the MLP, the serial steps on thread 0) DRAM sits idle, and on several threads each
 * thread spends part of every step waiting at the team's meetings.  A waiting thread
 * can ask for the rows of its next products instead of pausing: they are then L2 hits
 * when it reaches them.  A tight loop of prefetches is throttled by the line fill
 * buffers at about the DRAM rate, so a waiter still sees the meeting end within one
 * memory latency.
 *
 * What.  A list of byte ranges in the order the thread reads them (line aligned), each
 * tagged with a phase: the product call, or MLP, that reads it.  The pump asks for one
 * line at a time, at most `ahead` bytes beyond what is consumed (so lines it brought
 * are still in L2 when read; the L2 is 1-2 MB a core); nc_pf_done(s, p) says phases up
 * to p are consumed, and the pump skips what it had not reached.  The stream changes
 * nothing but timing: a wrong plan only wastes bandwidth.
 */
#ifndef NEEDLE_CY_PREFETCH_STREAM_H
#define NEEDLE_CY_PREFETCH_STREAM_H

#include <stddef.h>
#include <stdint.h>

#define NC_PF_RANGES 2048

typedef struct {
    /* what the pump moves (one thread's own; a whole line, the arrays lines apart) */
    int n;                          /* ranges in use */
    int cur;                        /* range holding the next line to ask for */
    long long pos;                  /* stream offset of that line */
    long long done;                 /* stream offset consumed so far */
    long long ahead;                /* most bytes asked for beyond `done` (0: never pump) */
    char _pad[64 - 2 * sizeof(int) - 3 * sizeof(long long)];
    const char* at[NC_PF_RANGES];   /* range i: its first line */
    long long end[NC_PF_RANGES];    /* offset in the stream just past range i */
    int phase[NC_PF_RANGES];        /* what reads it (non-decreasing) */
} nc_pf_stream;

static inline void nc_pf_clear(nc_pf_stream* s, long long ahead) {
    s->n = 0;
    s->cur = 0;
    s->pos = 0;
    s->done = 0;
    s->ahead = ahead;
}

/* Append [p, p + bytes) for phase `phase` (whole lines); dropped when full or empty. */
static inline void nc_pf_add(nc_pf_stream* s, const void* p, long long bytes, int phase) {
    uintptr_t a, b;
    long long start;
    if (p == NULL || bytes <= 0 || s->n >= NC_PF_RANGES)
        return;
    a = (uintptr_t)p & ~(uintptr_t)63;
    b = ((uintptr_t)p + (uintptr_t)bytes + 63) & ~(uintptr_t)63;
    start = s->n > 0 ? s->end[s->n - 1] : 0;
    s->at[s->n] = (const char*)a;
    s->end[s->n] = start + (long long)(b - a);
    s->phase[s->n] = phase;
    s->n++;
}

/* Back to the start, nothing consumed (a new step over the same plan). */
static inline void nc_pf_rewind(nc_pf_stream* s) {
    s->cur = 0;
    s->pos = 0;
    s->done = 0;
}

/* Phases ≤ p are read: the budget moves past them, the pump skips what it missed. */
static inline void nc_pf_done(nc_pf_stream* s, int p) {
    int i;
    long long d;
    if (s == NULL)
        return;
    i = s->cur;
    /* the first range of a later phase from the pump's range on, or from before it */
    while (i > 0 && s->phase[i - 1] > p)
        i--;
    while (i < s->n && s->phase[i] <= p)
        i++;
    d = i > 0 ? s->end[i - 1] : 0;
    if (d > s->done)
        s->done = d;
    if (s->pos < s->done) {
        s->pos = s->done;
        s->cur = i;
    }
}

/* The next line due (and the stream moved past it), or NULL when none is due now. */
static inline const char* nc_pf_next(nc_pf_stream* s) {
    long long start;
    const char* line;
    if (s == NULL || s->cur >= s->n || s->pos >= s->done + s->ahead)
        return NULL;
    start = s->cur > 0 ? s->end[s->cur - 1] : 0;
    line = s->at[s->cur] + (s->pos - start);
    s->pos += 64;
    if (s->pos >= s->end[s->cur])
        s->cur++;
    return line;
}

/* Ask for the next line due into L2; 0 when none is due now. */
static inline int nc_pf_pump(nc_pf_stream* s) {
    const char* line = nc_pf_next(s);
    if (line == NULL)
        return 0;
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(line, 0, 2);
#endif
    return 1;
}

/* Plain prefetch loops, for a caller that asks for a whole range at once instead of
   through a stream (_cq.cq_prefetch_rows: a block of a matrix's rows; _model: a
   thread's share of the next weights).  Both ask for L2 (prefetcht1), as the pump does. */
/* every 64-byte line of [p, p + n) into L2 (prefetcht1) */
static inline void nc_prefetch_bytes_l2(const char* p, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i += 64) __builtin_prefetch(p + i, 0, 2);
}
/* every 16th float of [p, p + n): one per 64-byte line */
static inline void nc_prefetch_floats(const float* p, ptrdiff_t n) {
    for (ptrdiff_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 2);
}

#endif
