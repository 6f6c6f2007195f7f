/* verify --deep: the references between the store's records resolve (FORMAT.md 5 `jref`,
 * 5a `ir` places).
 *
 * A `jref` item (an entry's item beginning with C1 6A 72 66, then msgpack [lsn] or [lsn,
 * start, end, pre, post]) must name a K_JOURNAL or K_COPY_JOURNAL frame whose rec holds an
 * `r` bin, with start <= end <= len(r); an `ir` place ([lsn, entry, index] among a journal
 * rec's `ir` items) must name own item `index` of a FULL list entry or a DELTA without
 * REFS. Frames are seen in LSN order and the references checked once the whole log was
 * seen, because a compaction's copies name copies written after them (the journal records,
 * copied last). Such a forward reference is checked only when its compaction has its END:
 * an abandoned compaction's copies are dead (replay ignores them) and may name LSNs that
 * the log later gave to other records. A forward reference anywhere else is damage.
 *
 * The heads are read with the small msgpack reader below (what msgpack-python writes:
 * FORMAT.md 5a); anything it cannot read in a frame that must hold a reference is reported,
 * never skipped in silence. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log_int.h"
#include "vrefs.h"

enum { K_BEGIN = 6, K_END = 7, K_COPY_CKPT = 8, K_COPY_WRITES = 9, K_JOURNAL = 11,
       K_COPY_JOURNAL = 12 };

static const uint8_t JREF_MAGIC[4] = {0xc1, 0x6a, 0x72, 0x66};

/* -- a msgpack reader: enough to walk a head ------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
} mp;

static uint64_t mp_be(const uint8_t *p, int w)
{
    uint64_t v = 0;
    for (int i = 0; i < w; i++)
        v = v << 8 | p[i];
    return v;
}

/* One value's header: its kind ('u' uint, 'n' negative int, 's' str, 'b' bin, 'a' array,
 * 'm' map, 'o' any other), *v its count, length or value, *body the bytes after the header
 * that belong to it (str, bin, ext, float). -1: not msgpack, or cut short. */
static int mp_head(mp *m, int *kind, uint64_t *v, uint64_t *body)
{
    static const int w124[3] = {1, 2, 4};
    if (m->p >= m->end)
        return -1;
    uint8_t b = *m->p++;
    size_t left = (size_t)(m->end - m->p);
    int w = 0;
    *body = 0;
    if (b <= 0x7f)
        return *kind = 'u', *v = b, 0;
    if (b >= 0xe0)
        return *kind = 'n', *v = 0, 0;
    if (b <= 0x8f)
        return *kind = 'm', *v = b & 0x0f, 0;
    if (b <= 0x9f)
        return *kind = 'a', *v = b & 0x0f, 0;
    if (b <= 0xbf)
        return *kind = 's', *v = *body = b & 0x1f, 0;
    switch (b) {
    case 0xc0: case 0xc2: case 0xc3:
        return *kind = 'o', *v = 0, 0;
    case 0xc4: case 0xc5: case 0xc6: case 0xd9: case 0xda: case 0xdb:
        w = w124[b <= 0xc6 ? b - 0xc4 : b - 0xd9];
        if (left < (size_t)w)
            return -1;
        *kind = b <= 0xc6 ? 'b' : 's';
        *v = *body = mp_be(m->p, w);
        m->p += w;
        return 0;
    case 0xc7: case 0xc8: case 0xc9:        /* ext: a length, a type byte, the data */
        w = w124[b - 0xc7];
        if (left < (size_t)w)
            return -1;
        *kind = 'o', *v = 0, *body = mp_be(m->p, w) + 1;
        m->p += w;
        return 0;
    case 0xca: return *kind = 'o', *v = 0, *body = 4, 0;
    case 0xcb: return *kind = 'o', *v = 0, *body = 8, 0;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        w = 1 << (b - 0xcc);
        if (left < (size_t)w)
            return -1;
        *kind = 'u', *v = mp_be(m->p, w);
        m->p += w;
        return 0;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {    /* a signed int: >= 0 reads as uint */
        w = 1 << (b - 0xd0);
        if (left < (size_t)w)
            return -1;
        uint64_t u = mp_be(m->p, w);
        int neg = (u >> (8 * w - 1)) & 1;
        m->p += w;
        return *kind = neg ? 'n' : 'u', *v = neg ? 0 : u, 0;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:    /* fixext: type + 1..16 */
        return *kind = 'o', *v = 0, *body = 1 + (1u << (b - 0xd4)), 0;
    case 0xdc: case 0xdd: case 0xde: case 0xdf:
        w = b & 1 ? 4 : 2;
        if (left < (size_t)w)
            return -1;
        *kind = b <= 0xdd ? 'a' : 'm', *v = mp_be(m->p, w);
        m->p += w;
        return 0;
    default:
        return -1;      /* 0xc1: never used by msgpack */
    }
}

/* Past one whole value (nested ones included). */
static int mp_skip(mp *m, int depth)
{
    int kind;
    uint64_t v, body;
    if (depth > 100 || mp_head(m, &kind, &v, &body) || (uint64_t)(m->end - m->p) < body)
        return -1;
    m->p += body;
    if (kind == 'a' || kind == 'm') {
        uint64_t n = kind == 'm' ? 2 * v : v;
        if (n > (uint64_t)(m->end - m->p))      /* each value is at least a byte */
            return -1;
        for (uint64_t i = 0; i < n; i++)
            if (mp_skip(m, depth + 1))
                return -1;
    }
    return 0;
}

static int mp_uint(mp *m, uint64_t *out)
{
    int kind;
    uint64_t body;
    return mp_head(m, &kind, out, &body) || kind != 'u' ? -1 : 0;
}

/* An array's length, or -1 when the next value is not an array. */
static int64_t mp_array(mp *m)
{
    int kind;
    uint64_t v, body;
    return mp_head(m, &kind, &v, &body) || kind != 'a' ? -1 : (int64_t)v;
}

/* -- what the scan keeps ---------------------------------------------------------------- */

static int push_ref(dkv_vrefs *v, const dkv_vref *x)
{
    if (DKV_RESERVE(v->refs, v->cap_refs, v->n_refs + 1, 256))
        return -1;
    v->refs[v->n_refs++] = *x;
    return 0;
}

/* A journal rec (a map): the length of its `r` bin (-1: none), and its `ir` places. */
static const char *journal_rec(dkv_vrefs *v, mp *m, dkv_vref *at, int64_t *rlen, int *oom)
{
    int kind;
    uint64_t n, body;
    *rlen = -1;
    if (mp_head(m, &kind, &n, &body) || kind != 'm')
        return "a journal record that is not a msgpack map";
    for (uint64_t i = 0; i < n; i++) {
        uint64_t klen;
        if (mp_head(m, &kind, &klen, &body) || (uint64_t)(m->end - m->p) < body)
            return "a journal record that does not decode";
        const uint8_t *key = m->p;
        m->p += body;
        int is_r = kind == 's' && klen == 1 && key[0] == 'r';
        int is_ir = kind == 's' && klen == 2 && key[0] == 'i' && key[1] == 'r';
        if (is_r) {
            mp look = *m;
            uint64_t len;
            if (!mp_head(&look, &kind, &len, &body) && kind == 'b')
                *rlen = (int64_t)len;
        } else if (is_ir) {       /* [shape, base, items]: items that are [lsn, entry, index] */
            mp look = *m;
            int64_t items;
            if (mp_array(&look) == 3 && !mp_skip(&look, 0) && !mp_skip(&look, 0)
                    && (items = mp_array(&look)) >= 0) {
                for (int64_t k = 0; k < items; k++) {
                    mp one = look;
                    dkv_vref x = *at;
                    x.kind = 'p';
                    if (mp_array(&one) == 3 && !mp_uint(&one, &x.to) && !mp_uint(&one, &x.start)
                            && !mp_uint(&one, &x.end) && push_ref(v, &x))
                        return *oom = 1, NULL;
                    if (mp_skip(&look, 0))
                        return "a journal record's ir that does not decode";
                }
            }
        }
        if (mp_skip(m, 0))
            return "a journal record that does not decode";
    }
    return NULL;
}

/* The jref items of one entry (its items at payload offset io). */
static const char *entry_jrefs(dkv_vrefs *v, const uint8_t *p, uint32_t len, uint32_t io,
                               uint32_t n_items, const dkv_vref *at, int *oom)
{
    const uint8_t *q = p + io, *end = p + len;
    for (uint32_t k = 0; k < n_items; k++) {
        if (end - q < 4)
            return "an entry's items run past the frame";
        uint32_t l = get32(q);
        if ((uint64_t)(end - q - 4) < l)
            return "an entry's items run past the frame";
        const uint8_t *item = q + 4;
        q += 4 + (size_t)l;
        if (l < 4 || memcmp(item, JREF_MAGIC, 4))
            continue;
        mp m = {item + 4, item + l};
        dkv_vref x = *at;
        x.kind = 'j';
        x.start = 0, x.end = NO_LSN;        /* the short form: the whole result */
        int64_t n = mp_array(&m);
        if ((n != 1 && n != 5) || mp_uint(&m, &x.to))
            return "a jref item that does not decode";
        if (n == 5 && (mp_uint(&m, &x.start) || mp_uint(&m, &x.end) || x.start > x.end
                       || mp_skip(&m, 0) || mp_skip(&m, 0)))
            return "a jref item that does not decode";
        if (m.p != m.end)
            return "a jref item that does not decode";
        if (push_ref(v, &x))
            return *oom = 1, NULL;
    }
    return NULL;
}

const char *dkv__vrefs_frame(dkv_vrefs *v, uint64_t lsn, const uint8_t *p, uint32_t len,
                             uint32_t seg, uint64_t off, int *oom)
{
    uint32_t ho, hl, n;
    if (dkv_commit_head(p, len, &ho, &hl, &n))
        return NULL;                        /* reported by the entries' check */
    mp m = {p + ho, p + ho + hl};
    uint64_t kind;
    if (mp_array(&m) < 1 || mp_uint(&m, &kind))
        return NULL;                        /* not a store record: nothing to resolve */
    /* a compaction's state, as a replay follows it (FORMAT.md 7) */
    int copy = kind == K_COPY_CKPT || kind == K_COPY_WRITES || kind == K_COPY_JOURNAL;
    if (kind == K_BEGIN) {
        v->open = lsn;
    } else if (kind == K_END) {
        uint64_t begin;
        if (v->open != NO_LSN && !mp_uint(&m, &begin) && begin == v->open) {
            if (DKV_RESERVE(v->ends, v->cap_ends, v->n_ends + 1, 16))
                return *oom = 1, NULL;
            v->ends[v->n_ends++] = begin;
        }
        v->open = NO_LSN;
    } else if (!copy) {
        v->open = NO_LSN;
    }
    dkv_vref at = {.from = lsn, .seg = seg, .off = off, .begin = copy ? v->open : NO_LSN};
    if (kind == K_JOURNAL || kind == K_COPY_JOURNAL) {
        int64_t rlen = -1;
        const char *bad = NULL;
        if (mp_skip(&m, 0))                 /* the run id, or the runs */
            bad = "a journal record's head that does not decode";
        else
            bad = journal_rec(v, &m, &at, &rlen, oom);
        if (*oom)
            return NULL;
        if (DKV_RESERVE(v->res, v->cap_res, v->n_res + 1, 256))
            return *oom = 1, NULL;
        v->res[v->n_res++] = (dkv_vres){lsn, rlen};
        if (bad)
            return bad;
    }
    for (uint32_t i = 0; i < n; i++) {
        dkv_entry_desc d;
        uint32_t io;
        if (dkv_commit_entry(p, len, i, &d, &io))
            return NULL;                    /* reported by the entries' check */
        if (d.kind == DKV_ENTRY_SNAP || (d.kind == DKV_ENTRY_DELTA && (d.flags & DKV_ENTRY_F_REFS)))
            continue;                       /* their items are 12-byte references */
        const char *bad = entry_jrefs(v, p, len, io, d.n_items, &at, oom);
        if (bad || *oom)
            return bad;
    }
    return NULL;
}

static const dkv_vres *find_res(const dkv_vrefs *v, uint64_t lsn)
{
    size_t lo = 0, hi = v->n_res;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v->res[mid].lsn == lsn)
            return &v->res[mid];
        if (v->res[mid].lsn < lsn)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *dkv__vrefs_check(const dkv_vrefs *v, const dkv_vref *x, dkv__vrefs_entry_fn entry,
                             void *ctx, char *buf, size_t cap)
{
    if (x->to >= x->from) {         /* forward: only a finished compaction's copies may */
        int done = 0;
        for (size_t i = 0; i < v->n_ends && !done; i++)
            done = x->begin != NO_LSN && v->ends[i] == x->begin;
        if (x->begin != NO_LSN && !done)
            return NULL;            /* an abandoned compaction's copy: dead, not read */
        if (!done) {
            snprintf(buf, cap, "%s names frame %llu, not an earlier one",
                     x->kind == 'j' ? "a jref item" : "an ir place", (unsigned long long)x->to);
            return buf;
        }
    }
    if (x->kind == 'j') {
        const dkv_vres *r = find_res(v, x->to);
        if (!r)
            snprintf(buf, cap, "a jref item names frame %llu, which is not a journal record "
                     "the log holds", (unsigned long long)x->to);
        else if (r->rlen < 0)
            snprintf(buf, cap, "a jref item names frame %llu, a journal record without a result",
                     (unsigned long long)x->to);
        else if (x->end != NO_LSN && x->end > (uint64_t)r->rlen)
            snprintf(buf, cap, "a jref item slices [%llu:%llu] of frame %llu's result of %lld "
                     "bytes", (unsigned long long)x->start, (unsigned long long)x->end,
                     (unsigned long long)x->to, (long long)r->rlen);
        else
            return NULL;
        return buf;
    }
    int64_t items = entry(ctx, x->to, (uint32_t)x->start);
    if (x->start > UINT32_MAX || items < 0)
        snprintf(buf, cap, "an ir place names entry %llu of frame %llu, which is not a list "
                 "entry with items of its own", (unsigned long long)x->start,
                 (unsigned long long)x->to);
    else if (x->end >= (uint64_t)items)
        snprintf(buf, cap, "an ir place names item %llu of entry %llu of frame %llu, which has "
                 "%lld", (unsigned long long)x->end, (unsigned long long)x->start,
                 (unsigned long long)x->to, (long long)items);
    else
        return NULL;
    return buf;
}

void dkv__vrefs_free(dkv_vrefs *v)
{
    free(v->res);
    free(v->refs);
    free(v->ends);
    memset(v, 0, sizeof *v);
}
