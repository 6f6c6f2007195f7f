/* prefault.h: fault in a large new buffer's pages in one call, shared by durkv's C code
 * (static inline: each extension compiles its own copy).
 *
 * A long journal's run opens into tens of MB of fresh memory written once (its records'
 * heads, their index entries). A page fault for each 4 KiB of it cost as much as reading
 * and checking the frames; MADV_POPULATE_WRITE (Linux 5.14+) maps them all in one call.
 * Where it is missing or refused, nothing happens: the pages fault in as they are written.
 */
#ifndef DKV_PREFAULT_H
#define DKV_PREFAULT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define DKV_PREFAULT_MIN (1u << 20)     /* smaller buffers gain nothing worth a syscall */

static inline void dkv_prefault(void *b, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    const uintptr_t page = 4096;
    uintptr_t lo = ((uintptr_t)b + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)b + n) & ~(page - 1);
    if (n >= DKV_PREFAULT_MIN && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
    (void)b, (void)n;
#endif
}

/* Ask for transparent huge pages under b[0:n] (its 2 MiB-aligned interior) before it is
 * faulted in: a fault then maps and zeroes 2 MiB at once, not 4 KiB (the per-page work,
 * not the zeroing, was most of a fresh process's cost for tens of MB). Only for buffers
 * written whole or nearly; a no-op where THP is off. */
#define DKV_HUGE_MIN (4u << 20)

static inline void dkv_hugepages(void *b, size_t n)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = 2u << 20;
    uintptr_t lo = ((uintptr_t)b + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)b + n) & ~(huge - 1);
    if (n >= DKV_HUGE_MIN && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)b, (void)n;
#endif
}

#endif
