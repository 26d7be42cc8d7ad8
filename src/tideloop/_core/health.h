/* Loop health: the fixed-size, log-bucket histograms every loop keeps, and
 * the clock they are fed from.
 *
 * One writer (the loop's thread) and any number of readers (a metrics
 * scrape from another thread, with or without a GIL): a bucket is a 64-bit
 * word written with a relaxed atomic store and read with a relaxed atomic
 * load, so a reader never sees a torn value, only one that is a few events
 * behind.  Recording allocates nothing.  Leaf: includes only the C library. */
#ifndef TIDELOOP_HEALTH_H
#define TIDELOOP_HEALTH_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds of CLOCK_MONOTONIC: the clock of loop.time(). */
static inline int64_t
tl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The same in seconds, as a double: loop.time(). */
static inline double
tl_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A cheaper clock for timing every callback: the CPU's time-stamp counter
 * (one instruction, against clock_gettime's ~50), in ticks that the loop
 * converts with a ratio it measures against tl_now_ns() (see
 * tl_health_calibrate).  Elsewhere than x86-64 a tick is a nanosecond. */
static inline uint64_t
tl_ticks(void)
{
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    return (uint64_t)tl_now_ns();
#endif
}

/* Buckets: [0, 1024 ns), then two per power of two from 2^10 ns (~1 us):
 * [2^b, 1.5*2^b) and [1.5*2^b, 2^(b+1)) for b = 10..40, and a last one from
 * 2^41 ns (~37 minutes) up.  HDR-style: the relative error of any value is
 * under a third, whatever its size, in 64 words. */
#define TL_HIST_BUCKETS 64
#define TL_HIST_FIRST_OCTAVE 10

typedef struct {
    uint64_t counts[TL_HIST_BUCKETS];
    uint64_t sum_ns;
    uint64_t max_ns;
} tl_hist;

static inline int
tl_hist_bucket(uint64_t ns)
{
    if (ns < (1 << TL_HIST_FIRST_OCTAVE))
        return 0;
    int b = 63 - __builtin_clzll(ns);
    int i = 1 + 2 * (b - TL_HIST_FIRST_OCTAVE) + (int)((ns >> (b - 1)) & 1);
    return i < TL_HIST_BUCKETS ? i : TL_HIST_BUCKETS - 1;
}

/* The lower bound of bucket i, in ns. */
static inline uint64_t
tl_hist_lower_ns(int i)
{
    if (i == 0)
        return 0;
    int b = (i - 1) / 2 + TL_HIST_FIRST_OCTAVE;
    uint64_t lo = (uint64_t)1 << b;
    return (i - 1) % 2 ? lo + (lo >> 1) : lo;
}

#define TL_ATOMIC_SET(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define TL_ATOMIC_GET(p) __atomic_load_n((p), __ATOMIC_RELAXED)
/* Counters more than one thread bumps (module-wide ones). */
#define TL_ATOMIC_ADD(p, v) ((void)__atomic_fetch_add((p), (v), __ATOMIC_RELAXED))

/* Only the loop's thread records into a histogram. */
static inline void
tl_hist_record(tl_hist *h, int64_t value)
{
    uint64_t ns = value > 0 ? (uint64_t)value : 0;
    uint64_t *c = &h->counts[tl_hist_bucket(ns)];
    TL_ATOMIC_SET(c, *c + 1);
    TL_ATOMIC_SET(&h->sum_ns, h->sum_ns + ns);
    if (ns > h->max_ns)
        TL_ATOMIC_SET(&h->max_ns, ns);
}

/* A counter that only the loop's thread bumps. */
static inline void
tl_count(uint64_t *c, uint64_t n)
{
    TL_ATOMIC_SET(c, *c + n);
}

#endif
