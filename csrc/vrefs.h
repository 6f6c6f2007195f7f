/* verify --deep: journal references between records (vrefs.c). */
#ifndef DKV_VREFS_H
#define DKV_VREFS_H

#include <stddef.h>
#include <stdint.h>

/* A journal frame and the length of its rec's `r` bin (-1: none). */
typedef struct {
    uint64_t lsn;
    int64_t rlen;
} dkv_vres;

/* One reference to check once the whole log was seen: kind 'j' (a jref item: start, end
 * of the slice, end NO_LSN for the whole result) or 'p' (an ir place: start is the entry,
 * end the item). seg, off: the referring frame's segment (index) and offset; begin: the
 * compaction whose copy it is (NO_LSN: none). */
typedef struct {
    uint64_t from, to, start, end, off, begin;
    uint32_t seg;
    int kind;
} dkv_vref;

typedef struct {
    dkv_vres *res;
    size_t n_res, cap_res;
    dkv_vref *refs;
    size_t n_refs, cap_refs;
    uint64_t *ends;         /* BEGIN LSNs of the compactions that have their END */
    size_t n_ends, cap_ends;
    uint64_t open;          /* the compaction being copied (its BEGIN), or NO_LSN */
} dkv_vrefs;

/* Take one COMMIT frame (LSN order). Returns a detail string when the frame itself holds an
 * unreadable reference; *oom set on allocation failure. */
const char *dkv__vrefs_frame(dkv_vrefs *v, uint64_t lsn, const uint8_t *payload, uint32_t len,
                             uint32_t seg, uint64_t off, int *oom);

/* How many own items entry `idx` of frame `lsn` holds (-1: no such FULL list entry or DELTA
 * without REFS). */
typedef int64_t (*dkv__vrefs_entry_fn)(void *ctx, uint64_t lsn, uint32_t idx);

/* NULL when reference x resolves, else its detail (written to buf). */
const char *dkv__vrefs_check(const dkv_vrefs *v, const dkv_vref *x, dkv__vrefs_entry_fn entry,
                             void *ctx, char *buf, size_t cap);

void dkv__vrefs_free(dkv_vrefs *v);

#endif
