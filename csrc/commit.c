/* COMMIT payloads (FORMAT.md §5): decoding, and dkv_read_channel, which walks a
 * channel's DELTA/SNAP references back to its base and returns the materialized item list.
 *
 *   commit := head_len:u32 head n_entries:u32 entry*
 *   entry  := kind:u8 flags:u8 reserved:u16 depth:u32 prev_lsn:u64 prev_idx:u32 n_items:u32 item*
 *   item   := len:u32 bytes
 *
 * Frames are encoded in Python (durkv.payload): joining a small frame with struct is
 * cheaper than marshalling item arrays through cffi. C decodes them to read channels
 * and for verify --deep; the tests hold the two sides to each other.
 */
#include <stdlib.h>

#include "dkv_internal.h"

#define ENTRY_HDR 24
#define MAX_WALK (1u << 26)     /* entries visited by one read_channel: a corrupt-loop guard */

/* Bounds-check one entry at off; returns the offset after it, or 0 if malformed. */
static size_t entry_end(const uint8_t *b, size_t len, size_t off, dkv_entry_desc *d)
{
    if (len - off < ENTRY_HDR || off > len)
        return 0;
    const uint8_t *p = b + off;
    d->kind = p[0];
    d->flags = p[1];
    d->depth = get32(p + 4);
    d->prev_lsn = get64(p + 8);
    d->prev_idx = get32(p + 16);
    d->n_items = get32(p + 20);
    if (d->kind < DKV_ENTRY_FULL || d->kind > DKV_ENTRY_SNAP || get16(p + 2) || (d->flags & ~7u))
        return 0;
    int refs = d->kind == DKV_ENTRY_SNAP || (d->flags & DKV_ENTRY_F_REFS);
    if ((d->flags & DKV_ENTRY_F_REFS) && (d->kind != DKV_ENTRY_DELTA || (d->flags & DKV_ENTRY_F_VALUE)))
        return 0;
    off += ENTRY_HDR;
    for (uint32_t i = 0; i < d->n_items; i++) {
        if (len - off < 4)
            return 0;
        uint32_t l = get32(b + off);
        if (len - off - 4 < l)
            return 0;
        if (refs && l != 12)
            return 0;
        off += 4 + (size_t)l;
    }
    return off;
}

/* The head's length and the entry count of a payload: 0, or DKV_ECORRUPT when it is too
 * short to hold them. Its entries start at 8 + *hl. */
static int commit_frame(const uint8_t *payload, size_t len, uint32_t *hl, uint32_t *n)
{
    if (len < 8 || (size_t)get32(payload) > len - 8)
        return DKV_ECORRUPT;
    *hl = get32(payload);
    *n = get32(payload + 4 + *hl);
    return 0;
}

int dkv_commit_head(const uint8_t *payload, size_t len, uint32_t *head_off, uint32_t *head_len,
                    uint32_t *n_entries)
{
    uint32_t hl, n;
    if (commit_frame(payload, len, &hl, &n))
        return DKV_ECORRUPT;
    size_t off = 8 + (size_t)hl;
    dkv_entry_desc d;
    for (uint32_t e = 0; e < n; e++)
        if (!(off = entry_end(payload, len, off, &d)))
            return DKV_ECORRUPT;
    if (off != len)
        return DKV_ECORRUPT;
    *head_off = 4;
    *head_len = hl;
    *n_entries = n;
    return 0;
}

int dkv_commit_entry(const uint8_t *payload, size_t len, uint32_t idx, dkv_entry_desc *out,
                     uint32_t *items_off)
{
    uint32_t hl, n;
    if (commit_frame(payload, len, &hl, &n))
        return DKV_ECORRUPT;
    if (idx >= n)
        return DKV_EINVAL;
    size_t off = 8 + (size_t)hl;
    for (uint32_t e = 0; e < idx; e++)
        if (!(off = entry_end(payload, len, off, out)))
            return DKV_ECORRUPT;
    if (!entry_end(payload, len, off, out))
        return DKV_ECORRUPT;
    *items_off = (uint32_t)(off + ENTRY_HDR);
    return 0;
}

/* ---- dkv_read_channel ---- */

typedef struct {
    uint64_t lsn;
    uint8_t *buf;
    uint32_t len;
} frame_ref;

typedef struct {
    frame_ref *v;       /* sorted by descending lsn: the walk never goes forward */
    size_t n, cap;
} frame_cache;

static int cache_get(dkv_log *log, frame_cache *c, uint64_t lsn, frame_ref **out)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->v[mid].lsn == lsn) {
            *out = &c->v[mid];
            return 0;
        }
        if (c->v[mid].lsn > lsn)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint8_t *buf;
    uint32_t len;
    uint8_t type;
    int rc = dkv_read_alloc(log, lsn, &buf, &len, &type);
    if (rc)
        return rc;
    if (type != DKV_FRAME_COMMIT) {
        free(buf);
        dkv__set_error(log, "lsn %llu is not a COMMIT frame", (unsigned long long)lsn);
        return DKV_ECORRUPT;
    }
    if (DKV_RESERVE(c->v, c->cap, c->n + 1, 16)) {
        free(buf);
        return DKV_ENOMEM;
    }
    memmove(&c->v[lo + 1], &c->v[lo], (c->n - lo) * sizeof *c->v);
    c->v[lo] = (frame_ref){lsn, buf, len};
    c->n++;
    *out = &c->v[lo];
    return 0;
}

typedef struct {
    uint64_t lsn;
    uint32_t idx;
} entry_ref;

/* to is strictly before from: every hop must point back, which bounds the walk. */
static int refers_back(entry_ref to, entry_ref from)
{
    return to.lsn < from.lsn || (to.lsn == from.lsn && to.idx < from.idx);
}

/* Entries whose own items follow the base's, pushed newest first. */
typedef struct {
    entry_ref *v;
    size_t n, cap;
} ref_stack;

static int refs_reserve(ref_stack *s, size_t need)
{
    return DKV_RESERVE(s->v, s->cap, s->n + need, 64);
}

/* One hop back from cur, a DELTA or SNAP entry d (items at io in f): push the entries
 * whose items come after the base's, and say where the walk goes next. */
static int hop_back(dkv_log *log, const frame_ref *f, const dkv_entry_desc *d, uint32_t io,
                    entry_ref cur, ref_stack *suffix, entry_ref *next)
{
    if (refs_reserve(suffix, d->kind == DKV_ENTRY_DELTA ? 1 : (d->n_items ? d->n_items - 1 : 0)))
        return DKV_ENOMEM;
    if (d->kind == DKV_ENTRY_DELTA) {
        suffix->v[suffix->n++] = cur;
        *next = (entry_ref){d->prev_lsn, d->prev_idx};
    } else {
        if (!d->n_items) {
            dkv__set_error(log, "SNAP entry at lsn %llu idx %u has no references",
                           (unsigned long long)cur.lsn, cur.idx);
            return DKV_ECORRUPT;
        }
        /* items: the base reference first, then the DELTAs on top of it, oldest first */
        const uint8_t *p = f->buf + io;
        for (uint32_t k = d->n_items - 1; k >= 1; k--) {
            const uint8_t *r = p + (size_t)k * 16 + 4;
            entry_ref e = {get64(r), get32(r + 8)};
            if (!refers_back(e, cur))
                goto forward;
            suffix->v[suffix->n++] = e;
        }
        *next = (entry_ref){get64(p + 4), get32(p + 12)};
    }
    if (refers_back(*next, cur))
        return 0;
forward:
    dkv__set_error(log, "entry at lsn %llu idx %u refers forward", (unsigned long long)cur.lsn,
                   cur.idx);
    return DKV_ECORRUPT;
}

/* Follow the references from (lsn, idx) back to the channel's FULL base: *base and its
 * flags; suffix gets the entries whose items follow the base's. */
static int walk_to_base(dkv_log *log, frame_cache *cache, uint64_t lsn, uint32_t idx,
                        ref_stack *suffix, entry_ref *base, uint32_t *flags)
{
    entry_ref cur = {lsn, idx};
    for (uint32_t steps = 0;; steps++) {
        if (steps > MAX_WALK) {
            dkv__set_error(log, "channel chain from lsn %llu is too long", (unsigned long long)lsn);
            return DKV_ECORRUPT;
        }
        frame_ref *f;
        dkv_entry_desc d;
        uint32_t io;
        int rc = cache_get(log, cache, cur.lsn, &f);
        if (rc)
            return rc;
        if ((rc = dkv_commit_entry(f->buf, f->len, cur.idx, &d, &io))) {
            dkv__set_error(log, "lsn %llu has no channel entry %u", (unsigned long long)cur.lsn, cur.idx);
            /* A bad (lsn, idx) from the caller is not found; a reference to nothing is damage. */
            return rc == DKV_EINVAL && steps == 0 ? DKV_ENOLSN : DKV_ECORRUPT;
        }
        if (d.kind == DKV_ENTRY_FULL) {
            *base = cur;
            *flags = d.flags;
            return 0;
        }
        if ((rc = hop_back(log, f, &d, io, cur, suffix, &cur)))
            return rc;
    }
}

/* Count (out NULL: *total bytes, *count items) or copy into out at *w the n items at
 * buf + io, each len:u32 bytes. */
static void emit_items(const uint8_t *buf, size_t io, uint32_t n, uint8_t *out, size_t *w,
                       size_t *total, uint32_t *count)
{
    for (uint32_t i = 0; i < n; i++) {
        size_t l = 4 + (size_t)get32(buf + io);
        if (out) {
            memcpy(out + *w, buf + io, l);
            *w += l;
        } else {
            *total += l;
            (*count)++;
        }
        io += l;
    }
}

/* A DELTA whose items are refs (DKV_ENTRY_F_REFS): each names an earlier FULL list entry
 * (a pending write's) whose items it appends. e is the DELTA; its refs are at eb + io. */
static int emit_refs(dkv_log *log, frame_cache *cache, entry_ref e, const uint8_t *eb,
                     size_t io, uint32_t nrefs, uint8_t *out, size_t *w, size_t *total,
                     uint32_t *count)
{
    for (uint32_t k = 0; k < nrefs; k++) {
        const uint8_t *r = eb + io + (size_t)k * 16 + 4;
        entry_ref t = {get64(r), get32(r + 8)};
        frame_ref *tf;
        dkv_entry_desc d;
        uint32_t tio;
        int rc;
        if (!refers_back(t, e)) {
            dkv__set_error(log, "item reference at lsn %llu does not point back",
                           (unsigned long long)e.lsn);
            return DKV_ECORRUPT;
        }
        if ((rc = cache_get(log, cache, t.lsn, &tf)) ||
            (rc = dkv_commit_entry(tf->buf, tf->len, t.idx, &d, &tio))) {
            if (rc == DKV_ENOMEM)
                return rc;
            /* name the missing target too: it is the frame an operator must look for */
            dkv__set_error(log, "item reference at lsn %llu names no entry (lsn %llu entry %u)",
                           (unsigned long long)e.lsn, (unsigned long long)t.lsn, t.idx);
            return DKV_ECORRUPT;
        }
        if (d.kind != DKV_ENTRY_FULL || (d.flags & DKV_ENTRY_F_VALUE)) {
            dkv__set_error(log, "item reference at lsn %llu is not a FULL list entry",
                           (unsigned long long)e.lsn);
            return DKV_ECORRUPT;
        }
        emit_items(tf->buf, tio, d.n_items, out, w, total, count);
    }
    return 0;
}

/* The base's items, then each suffix entry's own, oldest first. out NULL: only count them
 * (*total bytes, *count items); else copy them into out. */
static int gather_items(dkv_log *log, frame_cache *cache, entry_ref base, const ref_stack *suffix,
                        uint8_t *out, size_t *total, uint32_t *count)
{
    size_t w = 0;
    for (size_t s = suffix->n + 1; s-- > 0;) {
        entry_ref e = s == suffix->n ? base : suffix->v[s];
        frame_ref *f;
        dkv_entry_desc d;
        uint32_t io;
        int rc;
        if ((rc = cache_get(log, cache, e.lsn, &f)) ||
            (rc = dkv_commit_entry(f->buf, f->len, e.idx, &d, &io)))
            return rc == DKV_ENOMEM ? rc : DKV_ECORRUPT;
        if (s != suffix->n && d.kind != DKV_ENTRY_DELTA) {
            dkv__set_error(log, "SNAP at or before lsn %llu refers to a non-DELTA entry",
                           (unsigned long long)e.lsn);
            return DKV_ECORRUPT;
        }
        if (!(d.flags & DKV_ENTRY_F_REFS)) {
            emit_items(f->buf, io, d.n_items, out, &w, total, count);
            continue;
        }
        /* the frame buffers stay put while the cache's array may move: keep f->buf */
        if ((rc = emit_refs(log, cache, e, f->buf, io, d.n_items, out, &w, total, count)))
            return rc;
    }
    return 0;
}

int dkv_read_channel(dkv_log *log, uint64_t lsn, uint32_t idx, uint8_t **buf_out,
                     size_t *len_out, uint32_t *n_items_out, uint32_t *flags_out)
{
    frame_cache cache = {0};
    ref_stack suffix = {0};
    entry_ref base;
    uint32_t flags = 0, count = 0;
    size_t total = 0;
    uint8_t *out = NULL;
    int rc = walk_to_base(log, &cache, lsn, idx, &suffix, &base, &flags);
    if (!rc)
        rc = gather_items(log, &cache, base, &suffix, NULL, &total, &count);
    if (!rc && !(out = malloc(total ? total : 1)))
        rc = DKV_ENOMEM;
    if (!rc)
        rc = gather_items(log, &cache, base, &suffix, out, &total, &count);
    if (!rc) {
        *flags_out = flags;
        *buf_out = out;
        *len_out = total;
        *n_items_out = count;
        out = NULL;
    }
    free(out);
    for (size_t i = 0; i < cache.n; i++)
        free(cache.v[i].buf);
    free(cache.v);
    free(suffix.v);
    return rc;
}
