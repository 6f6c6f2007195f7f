/* prefault.h: fault in a large new buffer's pages in one call, shared by durkv's C code
 * (static inline: each extension compiles its own copy).
 *
 * A long journal's run opens into tens of MB of fresh memory written once (its records'
 * heads, their index entries). A page fault for each 4 KiB of it cost as much as reading
 * and checking the frames; MADV_POPULATE_WRITE (Linux 5.14+) maps them all in one call.
 * Where it is missing or refused, nothing happens: the pages fault in as they are written.
 * For a buffer written whole, dkv_hugepages first asks for 2 MiB pages (fewer faults yet).
 */
#ifndef DKV_PREFAULT_H
#define DKV_PREFAULT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define DKV_PREFAULT_MIN (1u << 20)     /* smaller buffers gain nothing worth a syscall */
#define DKV_HUGE_MIN (4u << 20)

/* madvise(advice) over the `align`-aligned interior of b[0:n], when n >= min */
static inline void dkv__advise_within(void *b, size_t n, uintptr_t align, size_t min,
                                      int advice)
{
    uintptr_t lo = ((uintptr_t)b + align - 1) & ~(align - 1);
    uintptr_t hi = ((uintptr_t)b + n) & ~(align - 1);
    if (n >= min && hi > lo)
        (void)madvise((void *)lo, hi - lo, advice);
}

static inline void dkv_prefault(void *b, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    dkv__advise_within(b, n, 4096, DKV_PREFAULT_MIN, MADV_POPULATE_WRITE);
#else
    (void)b, (void)n;
#endif
}

/* Ask for transparent huge pages under b[0:n] (its 2 MiB-aligned interior) before it is
 * faulted in: a fault then maps and zeroes 2 MiB at once, not 4 KiB (the per-page work,
 * not the zeroing, was most of a fresh process's cost for tens of MB). Only for buffers
 * written whole or nearly; a no-op where THP is off. */
static inline void dkv_hugepages(void *b, size_t n)
{
#ifdef MADV_HUGEPAGE
    dkv__advise_within(b, n, (uintptr_t)2 << 20, DKV_HUGE_MIN, MADV_HUGEPAGE);
#else
    (void)b, (void)n;
#endif
}

#endif
