/* The read path of a log handle: frames by LSN (from the file, or from the writer's
 * pending buffer for frames not yet written), and the segment listing. Reads copy what
 * they need under the handle's mutex and pread outside it, so readers never wait for an
 * fsync. Every frame read is checked against its seeded crc. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log_int.h"
#include "prefault.h"

/* The segment holding lsn (the newest one whose base_lsn is <= lsn). mu held. */
static seg_t *find_seg(dkv_log *log, uint64_t lsn)
{
    size_t lo = 0, hi = log->nsegs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (log->segs[mid].base_lsn <= lsn)
            lo = mid;
        else
            hi = mid;
    }
    return log->nsegs ? &log->segs[lo] : NULL;
}

/* Locate frame lsn: either a copy from memory (*mem) or fd/offset/len to pread. mu held.
 * An fd comes pinned (dkv__fd_unpin after the pread); *own: the caller also closes it. */
static int locate(dkv_log *log, uint64_t lsn, uint8_t **mem, uint32_t *mlen, uint8_t *mtype,
                  int *fd, int *own, uint64_t *off, uint64_t *flen, char *segname, int *exact)
{
    for (;;) {
        int rc = dkv__usable(log, 0);
        if (rc)
            return rc;
        if (lsn < log->start_lsn || lsn >= log->next_lsn) {
            dkv__set_error(log, "lsn %llu is not in the log (it holds %llu..%llu)",
                           (unsigned long long)lsn, (unsigned long long)log->start_lsn,
                           (unsigned long long)log->next_lsn);
            return DKV_ENOLSN;
        }
        seg_t *s = find_seg(log, lsn);
        dkv__seg_name(segname, s->base_lsn);
        if (lsn - s->base_lsn >= s->count) {
            dkv__set_error(log, "lsn %llu was lost to damage", (unsigned long long)lsn);
            return DKV_ENOLSN;
        }
        if (!s->index_loaded && (rc = dkv__load_index(log, s)))
            return rc;
        uint64_t i = lsn - s->base_lsn;
        uint64_t o = s->index[i];
        if (!o) {
            dkv__set_error(log, "lsn %llu was lost to damage (segment %s)",
                           (unsigned long long)lsn, segname);
            return DKV_ENOLSN;
        }
        uint64_t next = s->data_end;
        *exact = 1;
        for (uint64_t j = i + 1; j < s->n_index; j++)
            if (s->index[j]) {
                next = s->index[j];
                *exact = j == i + 1;    /* salvage leaves 0 for lost frames: then a bound only */
                break;
            }
        if (!log->opt.read_only && s == &log->segs[log->nsegs - 1] && lsn >= log->written_lsn) {
            if (o < log->pend_off) {    /* in the leader's buffer: wait for it to land */
                pthread_cond_wait(&log->cv, &log->mu);
                continue;
            }
            const uint8_t *f = log->pend + (o - log->pend_off);
            *mlen = get32(f + 4);
            *mtype = f[16];
            *mem = malloc(*mlen ? *mlen : 1);
            if (!*mem)
                return DKV_ENOMEM;
            memcpy(*mem, f + FRAME_HDR, *mlen);
            return 0;
        }
        if ((rc = dkv__seg_fd(log, s, fd, own)))
            return rc;
        dkv__fd_pin(log);
        *off = o;
        *flen = next - o;
        return 0;
    }
}

int dkv_read_alloc(dkv_log *log, uint64_t lsn, uint8_t **buf, uint32_t *len, uint8_t *type)
{
    DKV_OWNED(log, DKV_EFORKED);
    int fd = -1, own = 0;
    uint64_t off = 0, flen = 0;
    char seg[64];
    uint8_t *mem = NULL;
    int exact = 1;
    pthread_mutex_lock(&log->mu);
    int rc = locate(log, lsn, &mem, len, type, &fd, &own, &off, &flen, seg, &exact);
    uint32_t seed = dkv__seed(log->uuid, find_seg(log, lsn)->segment_no);
    pthread_mutex_unlock(&log->mu);
    if (rc || mem) {
        *buf = mem;
        return rc;
    }
    uint8_t *f = malloc(flen ? flen : 1);
    int r = !f ? -ENOMEM : flen > INT32_MAX ? -EINVAL : dkv__pread_all(fd, f, flen, off);
    dkv__fd_unpin(log);
    if (own)
        close(fd);
    if (r < 0) {
        free(f);
        if (r == -ENOMEM)
            return DKV_ENOMEM;
        pthread_mutex_lock(&log->mu);
        rc = dkv__io_error(log, -r, "cannot read segment %s/%s offset %llu", log->dir, seg,
                           (unsigned long long)off);
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
    uint32_t l;
    uint64_t got;
    int k = dkv__frame_check(f, (size_t)r, seed, lsn, 0, &l, &got, type);
    if (k || (exact ? FRAME_HDR + (uint64_t)l != flen : FRAME_HDR + (uint64_t)l > flen)) {
        free(f);
        if (!k)
            k = DKV_DAMAGE_BAD_HEADER;
        char detail[64];
        snprintf(detail, sizeof detail, "frame of lsn %llu", (unsigned long long)lsn);
        pthread_mutex_lock(&log->mu);
        dkv__damage_record(log, seg, off, k, lsn, lsn, detail);
        pthread_mutex_unlock(&log->mu);
        return DKV_ECORRUPT;
    }
    memmove(f, f + FRAME_HDR, l);
    *buf = f;
    *len = l;
    return 0;
}

int dkv_segments(dkv_log *log, dkv_report **out)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    dkv_report *r = calloc(1, sizeof *r);
    size_t n = 0;
    if (r)
        r->segments = calloc(log->nsegs ? log->nsegs : 1, sizeof *r->segments);
    if (!r || !r->segments) {
        free(r);
        pthread_mutex_unlock(&log->mu);
        return DKV_ENOMEM;
    }
    for (size_t i = 0; i < log->nsegs; i++) {
        seg_t *s = &log->segs[i];
        if (s->removed)
            continue;
        dkv_segment_report *sr = &r->segments[n++];
        dkv__seg_name(sr->segment, s->base_lsn);
        sr->sealed = s->sealed;
        sr->segment_no = s->segment_no;
        sr->base_lsn = s->base_lsn;
        sr->frames_ok = s->count;
        sr->bytes = s->sealed ? s->file_size : s->data_end;
    }
    r->n_segments = n;
    r->frames_ok = log->next_lsn - log->start_lsn;
    r->next_lsn = log->next_lsn;
    pthread_mutex_unlock(&log->mu);
    *out = r;
    return 0;
}


/* Append the head of COMMIT payload p (plen bytes) to the growing buffer. */
static int put_head(dkv_log *log, uint64_t lsn, const uint8_t *p, uint32_t plen, uint8_t **out,
                    size_t *len, size_t *cap)
{
    uint32_t ho, hl, ne;
    if (dkv_commit_head(p, plen, &ho, &hl, &ne)) {
        pthread_mutex_lock(&log->mu);
        dkv__set_error(log, "lsn %llu is not a COMMIT frame with a head", (unsigned long long)lsn);
        pthread_mutex_unlock(&log->mu);
        return DKV_ECORRUPT;
    }
    if (DKV_RESERVE(*out, *cap, *len + hl, 64))
        return DKV_ENOMEM;
    memcpy(*out + *len, p + ho, hl);
    *len += hl;
    return 0;
}

/* Frames lo..hi-1 (consecutive LSNs) of one segment, already in its file, with one pread:
 * a run's journal records are mostly neighbours. *done: how many frames it handled (0:
 * nothing to gain here, or anything unusual -- the caller reads frame by frame, which
 * reports damage exactly as dkv_read_alloc does). */
#define RUN_READ_MAX (1u << 20)

static int read_run_heads(dkv_log *log, uint64_t lo, uint64_t hi, uint8_t *scratch,
                          uint8_t **out, size_t *len, size_t *cap, uint64_t *done)
{
    *done = 0;
    pthread_mutex_lock(&log->mu);
    if (dkv__usable(log, 0) || lo < log->start_lsn || hi > log->next_lsn || !log->nsegs) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    seg_t *s = find_seg(log, lo);
    if (hi > s->base_lsn + s->count)
        hi = s->base_lsn + s->count;
    if (!log->opt.read_only && s == &log->segs[log->nsegs - 1] && hi > log->written_lsn)
        hi = log->written_lsn;                  /* the rest is pending: frame by frame */
    if (hi <= lo + 1 || (!s->index_loaded && dkv__load_index(log, s))) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    /* Frames i0..i1-1 in one pread, which ends where frame i1 starts: i1 grows while that
     * frame is indexed (one lost to damage, in salvage, is not), is at most the first one
     * past the range, and the span stays within RUN_READ_MAX bytes (one buffer, reused: no
     * page faults per MB). The last wanted frame stays out when its successor is not
     * indexed (the caller reads it alone). Only the frames read are looked at: a journal
     * of n records is read in O(n), not O(n) per MB. */
    uint64_t i0 = lo - s->base_lsn, want = hi - s->base_lsn, i1 = i0;
    if (i0 < s->n_index && s->index[i0])
        while (i1 < want && i1 + 1 < s->n_index && s->index[i1 + 1] &&
               s->index[i1 + 1] - s->index[i0] <= RUN_READ_MAX)
            i1++;
    if (i1 <= i0 + 1) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    uint64_t off = s->index[i0], end = s->index[i1];
    uint32_t seed = dkv__seed(log->uuid, s->segment_no);
    int fd = -1, own = 0;
    if (end <= off || end - off > INT32_MAX || dkv__seg_fd(log, s, &fd, &own)) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    dkv__fd_pin(log);
    pthread_mutex_unlock(&log->mu);
    size_t flen = (size_t)(end - off);       /* at most RUN_READ_MAX: scratch holds it */
    uint8_t *f = scratch;
    int r = dkv__pread_all(fd, f, flen, off);
    dkv__fd_unpin(log);
    if (own)
        close(fd);
    if (r < 0 || (size_t)r != flen)
        return 0;                               /* an I/O error: the per-frame read reports it */
    /* Every frame checked as dkv_read_alloc does (seeded crc, its LSN), back to back. */
    size_t pos = 0;
    uint64_t n = i1 - i0, k;
    for (k = 0; k < n; k++) {
        uint32_t l;
        uint64_t got;
        uint8_t type;
        if (dkv__frame_check(f + pos, flen - pos, seed, lo + k, 0, &l, &got, &type) ||
            FRAME_HDR + (uint64_t)l > flen - pos)
            break;
        int rc = put_head(log, lo + k, f + pos + FRAME_HDR, l, out, len, cap);
        if (rc)
            return rc;
        pos += FRAME_HDR + (size_t)l;
    }
    *done = k;      /* a frame that did not check: the caller rereads it alone and reports */
    return 0;
}

/* See seglog.h. A frame's size is the distance to the next frame's offset (or to the
 * segment's data end), exactly as locate() bounds a read; with a lost neighbour it is only
 * a bound, so the count stops before that frame. */
int dkv_payload_bytes(dkv_log *log, const uint64_t *lsns, size_t n, uint64_t *total,
                     size_t *done)
{
    DKV_OWNED(log, DKV_EFORKED);
    uint64_t sum = 0;
    size_t k = 0;
    pthread_mutex_lock(&log->mu);
    int rc = dkv__usable(log, 0);
    for (; !rc && k < n; k++) {
        uint64_t lsn = lsns[k];
        if (lsn < log->start_lsn || lsn >= log->next_lsn)
            break;
        seg_t *s = find_seg(log, lsn);
        uint64_t i = lsn - s->base_lsn;
        if (i >= s->count || (!s->index_loaded && dkv__load_index(log, s)) || !s->index[i])
            break;
        uint64_t next = s->data_end;
        if (i + 1 < s->n_index) {
            if (!s->index[i + 1])
                break;
            next = s->index[i + 1];
        }
        sum += next - s->index[i] - FRAME_HDR;
    }
    pthread_mutex_unlock(&log->mu);
    *total = sum;
    *done = k;
    return rc;
}

/* Bytes enough for the heads of the n frames lsns, or near: their frames' bytes where the
 * segment index knows them (a run's records are mostly neighbours: one span each), 64 a
 * frame elsewhere. Sized once, the heads buffer is not grown (and copied) ~log2(n) times. */
static size_t heads_bound(dkv_log *log, const uint64_t *lsns, size_t n)
{
    size_t bound = 64;
    pthread_mutex_lock(&log->mu);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && lsns[j] == lsns[j - 1] + 1;)
            j++;
        seg_t *s = log->nsegs && lsns[i] >= log->start_lsn ? find_seg(log, lsns[i]) : NULL;
        uint64_t k0 = s ? lsns[i] - s->base_lsn : 0, k1 = s ? lsns[j - 1] - s->base_lsn + 1 : 0;
        if (s && s->index_loaded && k1 < s->n_index && s->index[k0] && s->index[k1] > s->index[k0])
            bound += (size_t)(s->index[k1] - s->index[k0]);
        else
            bound += 64 * (j - i);
    }
    pthread_mutex_unlock(&log->mu);
    return bound;
}

/* The heads of n COMMIT frames, as one msgpack array: a run's journal read in one call
 * (Python decodes the array with one unpackb instead of n binding calls and n decodes).
 * Each frame is read and crc-checked as dkv_read_alloc does; a payload that is not a
 * well-formed COMMIT (FORMAT.md §5) is DKV_ECORRUPT. Free *buf_out with dkv_free. */
int dkv_read_heads(dkv_log *log, const uint64_t *lsns, size_t n, uint8_t **buf_out,
                   size_t *len_out)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (n > UINT32_MAX)
        return DKV_EINVAL;
    size_t cap = heads_bound(log, lsns, n), len = 5;
    uint8_t *out = malloc(cap);
    if (!out)
        return DKV_ENOMEM;
    dkv_hugepages(out, cap);
    out[0] = 0xdd;                  /* msgpack array 32: big-endian count */
    out[1] = (uint8_t)(n >> 24);
    out[2] = (uint8_t)(n >> 16);
    out[3] = (uint8_t)(n >> 8);
    out[4] = (uint8_t)n;
    uint8_t *scratch = NULL;
    size_t faulted = 0;     /* out[0, faulted) is faulted in: two preads' heads ahead of len */
    for (size_t i = 0, j = 0; i < n;) {
        if (len + RUN_READ_MAX > faulted && faulted < cap) {
            /* ahead of the heads, not the whole bound: a bound of checkpoints' frames can be
             * many times their heads, and would stay resident while the buffer lives */
            size_t to = cap - len > 2 * RUN_READ_MAX ? len + 2 * RUN_READ_MAX : cap;
            dkv_prefault(out + faulted, to - faulted);
            faulted = to;
        }
        if (j <= i) {               /* lsns[i..j) consecutive: found once per run */
            j = i + 1;
            while (j < n && lsns[j] == lsns[j - 1] + 1)
                j++;
        }
        uint64_t done = 0;
        if (j - i > 1 && !scratch && !(scratch = malloc(RUN_READ_MAX))) {
            free(out);
            return DKV_ENOMEM;
        }
        int rc = j - i > 1 ? read_run_heads(log, lsns[i], lsns[j - 1] + 1, scratch, &out, &len,
                                            &cap, &done) : 0;
        if (!rc && !done) {                     /* one frame, read (and checked) alone */
            uint8_t *p, type;
            uint32_t plen;
            rc = dkv_read_alloc(log, lsns[i], &p, &plen, &type);
            if (!rc) {
                rc = put_head(log, lsns[i], p, plen, &out, &len, &cap);
                free(p);
            }
            done = 1;
        }
        if (rc) {
            free(scratch);
            free(out);
            return rc;
        }
        i += done;
    }
    free(scratch);
    *buf_out = out;
    *len_out = len;
    return 0;
}
