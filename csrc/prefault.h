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

#endif
