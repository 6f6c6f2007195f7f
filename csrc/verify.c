/* verify and recover: whole-directory checks without the write lock (verify) and the only
 * code that removes damaged bytes (recover), always copying them to quarantine/ first.
 *
 * Every byte of a segment is covered by some check: the header by header_crc, frames by
 * their seeded crc (and LSN continuity), the index and trailer by trailer_crc and by the
 * comparison of the index with the frame scan, the whole segment by segment_digest, and
 * the order of files by the chain (uuid, segment_no, base_lsn, prev_digest). What each
 * finding is, and moving bytes to quarantine/, is damage.c's (shared with open).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log_int.h"
#include "vrefs.h"

#define MAX_DAMAGE 1000

/* What verify learned about one segment, for the chain check and for recover's plan. */
typedef struct {
    int header_ok, sealed;
    seg_header h;
    uint32_t digest;        /* sealed: trailer digest */
    uint64_t count;         /* frames (from the scan) */
    uint64_t good_end;      /* offset after the last good frame before any damage */
    uint64_t size;
    int next_known;         /* next_lsn is trustworthy (clean scan, or a valid trailer) */
    uint64_t next_lsn;      /* LSN the next segment must start at */
    int digest_known;
} vseg;

/* Deep mode: every channel entry seen so far, in (lsn, idx) order. */
typedef struct {
    uint64_t lsn;
    uint32_t idx, n_items;
    uint8_t kind, flags;
} ventry;

typedef struct {
    ventry *v;
    size_t n, cap;
} ventries;

static const ventry *ventry_find(const ventries *e, uint64_t lsn, uint32_t idx)
{
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const ventry *m = &e->v[mid];
        if (m->lsn == lsn && m->idx == idx)
            return m;
        if (m->lsn < lsn || (m->lsn == lsn && m->idx < idx))
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int add_range(dkv_report *r, dkv_segment_report *sr, const char *seg, uint64_t off,
                     int kind, uint64_t lost_first, uint64_t lost_last, const char *detail)
{
    if (sr && !sr->kind) {
        sr->kind = kind;
        sr->bad_offset = off;
        snprintf(sr->detail, sizeof sr->detail, "%s", detail);
    }
    if (r->n_damage >= MAX_DAMAGE)
        return 0;
    return dkv__report_add_damage(r, seg, off, kind, lost_first, lost_last, detail);
}

static int add(dkv_report *r, dkv_segment_report *sr, const char *seg, uint64_t off, int kind,
               uint64_t lost_first, const char *detail)
{
    return add_range(r, sr, seg, off, kind, lost_first, NO_LSN, detail);
}

/* What verify found outside the segment files themselves, for recover's plan. */
typedef struct {
    int prefix_missing;     /* segments from start_lsn up to the first file are missing */
    int head_state;         /* 0 absent, 1 ok, 2 unreadable/bad, 3 foreign, 4 names a missing tail */
    log_head head;          /* head_state 1, 3, 4 */
} vdir_info;

/* Deep check of one COMMIT frame's references. Returns a detail string or NULL. */
static const char *check_commit(ventries *es, uint64_t lsn, const uint8_t *p, uint32_t len, int *oom)
{
    uint32_t ho, hl, n, io;
    if (dkv_commit_head(p, len, &ho, &hl, &n))
        return "malformed COMMIT payload";
    const char *bad = NULL;
    for (uint32_t i = 0; i < n; i++) {
        dkv_entry_desc d;
        dkv_commit_entry(p, len, i, &d, &io);
        if (d.kind == DKV_ENTRY_DELTA) {
            const ventry *t = ventry_find(es, d.prev_lsn, d.prev_idx);
            int back = d.prev_lsn < lsn || (d.prev_lsn == lsn && d.prev_idx < i);
            if (!bad && (!back || !t))
                bad = "DELTA prev does not resolve to an earlier entry";
            else if (!bad && t->kind == DKV_ENTRY_FULL && (t->flags & DKV_ENTRY_F_VALUE))
                bad = "DELTA prev is a non-list VALUE entry";
            for (uint32_t k = 0; (d.flags & DKV_ENTRY_F_REFS) && k < d.n_items && !bad; k++) {
                const uint8_t *r = p + io + (size_t)k * 16 + 4;
                uint64_t rl = get64(r);
                uint32_t ri = get32(r + 8);
                const ventry *u = ventry_find(es, rl, ri);
                if (!(rl < lsn || (rl == lsn && ri < i)) || !u)
                    bad = "DELTA item reference does not resolve to an earlier entry";
                else if (u->kind != DKV_ENTRY_FULL || (u->flags & DKV_ENTRY_F_VALUE))
                    bad = "DELTA item reference is not a FULL list entry";
            }
        } else if (d.kind == DKV_ENTRY_SNAP) {
            if (!d.n_items && !bad)
                bad = "SNAP without references";
            for (uint32_t k = 0; k < d.n_items && !bad; k++) {
                const uint8_t *r = p + io + (size_t)k * 16 + 4;
                uint64_t rl = get64(r);
                uint32_t ri = get32(r + 8);
                const ventry *t = ventry_find(es, rl, ri);
                int back = rl < lsn || (rl == lsn && ri < i);
                if (!back || !t)
                    bad = "SNAP reference does not resolve to an earlier entry";
                else if (k == 0 && t->kind == DKV_ENTRY_DELTA)
                    bad = "SNAP base reference is a DELTA (must be FULL or SNAP)";
                else if (k > 0 && t->kind != DKV_ENTRY_DELTA)
                    bad = "SNAP delta reference is not a DELTA";
            }
        }
        if (DKV_RESERVE(es->v, es->cap, es->n + 1, 1024)) {
            *oom = 1;
            return NULL;
        }
        es->v[es->n++] = (ventry){lsn, i, d.n_items, d.kind, d.flags};
    }
    return bad;
}

/* One segment's bytes: mapped (a sealed segment) or read (the active one). */
typedef struct {
    uint8_t *b;
    uint64_t size;
    size_t mapped;          /* 0: b is malloc'd */
} seg_bytes;

/* A sealed (not last) segment is mapped rather than copied: verify reads it once, straight
 * from the page cache. Only sealed files are: nothing truncates them while a writer runs
 * (only `recover --skip-corrupt`, which a concurrent verify must not race), whereas the
 * active segment may be cut by a writer's open under us. */
static int read_seg(const char *dir, uint64_t base, int last, seg_bytes *m)
{
    memset(m, 0, sizeof *m);
    char path[DKV_PATH_MAX];
    int fd = dkv__seg_path(path, dir, base) ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return dkv__io_error(NULL, errno, "segment %s is gone since verify listed the directory "
                             "(a writer's compaction unlinks old segments: run verify again); "
                             "cannot open it", path);
    if (fd < 0)
        return dkv__io_error(NULL, errno, "cannot open segment %s", path);
    struct stat st;
    if (!last && fstat(fd, &st) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
            m->b = p;
            m->size = m->mapped = (size_t)st.st_size;
        }
    }
    int rc = m->mapped ? 0 : dkv__read_file(fd, &m->b, &m->size);
    close(fd);
    return rc ? dkv__io_error(NULL, -rc, "cannot read segment %s", path) : 0;
}

static void release_seg(seg_bytes *m)
{
    if (m->mapped)
        munmap(m->b, m->mapped);
    else
        free(m->b);
}

/* Verifying one segment: where findings go. */
typedef struct {
    char name[64];
    uint64_t base;
    uint64_t expect;        /* the LSN this segment should start at: what damage here loses */
    dkv_report *r;
    dkv_segment_report *sr;
    vseg *vs;
} vctx;

static int found(vctx *c, uint64_t off, int kind, uint64_t lost_first, const char *detail)
{
    return add(c->r, c->sr, c->name, off, kind, lost_first, detail);
}

/* The header and its link to the previous segment. 1: nothing in the file can be placed
 * (no header, or a copy of another segment under this name); *rc: a report failure. */
static int check_header(vctx *c, const seg_bytes *m, int last, const vseg *prev,
                        const uint8_t *uuid0, int *rc)
{
    vseg *vs = c->vs;
    const char *why = "";
    if (dkv__header_decode(m->b, m->size, &vs->h, &why)) {
        vs->good_end = 0;
        *rc = found(c, 0, dkv__classify_header(last, m->size), c->expect, why);
        return 1;
    }
    vs->header_ok = 1;
    c->sr->segment_no = vs->h.segment_no;
    seg_link link = {.uuid = uuid0};
    if (prev)
        link = (seg_link){uuid0, 1, prev->h.segment_no, prev->h.base_lsn, prev->next_known,
                          prev->next_lsn, prev->digest_known, prev->digest};
    uint64_t off;
    char detail[160];
    int kind = dkv__check_link(&vs->h, c->base, &link, &off, detail, sizeof detail);
    if (kind)
        found(c, off, kind, c->expect, detail);
    if (kind && off == HDR_OFF_BASE_LSN) {
        /* a copy of another segment under this name: nothing in it can be placed, and the
         * next file is checked against what precedes this one (not blamed for it) */
        vs->header_ok = 0;
        vs->good_end = 0;
        return 1;
    }
    return 0;
}

/* What the trailer says: tr 0 if it decodes, tcrc_ok if its checksum verifies. */
typedef struct {
    seg_trailer t;
    int tr, tcrc_ok;
} vtrailer;

static void read_trailer(vctx *c, const seg_bytes *m, int last, uint32_t seed, vtrailer *vt)
{
    uint64_t size = m->size;
    vt->tr = size >= HDR_LEN + FRAME_HDR + 8 + TRAILER_LEN ?
             dkv__trailer_decode(m->b + size - TRAILER_LEN, size, c->base, &vt->t) : -1;
    vt->tcrc_ok = vt->tr == 0 && dkv__trailer_crc(seed, m->b + vt->t.data_end, vt->t.count,
                                                  m->b + size - TRAILER_LEN) == vt->t.crc;
    c->vs->sealed = c->sr->sealed = !last || (vt->tr == 0 && vt->tcrc_ok);
    if (c->vs->sealed && vt->tr == 0) {
        c->vs->digest = vt->t.digest;
        if (!vt->tcrc_ok)
            found(c, vt->t.data_end, DKV_DAMAGE_BAD_SEAL, c->expect, TRAILER_CRC_WHY);
    }
}

/* After the frame scan: what it found, against the trailer. */
static void report_scan(vctx *c, const seg_bytes *m, const vtrailer *vt, const scan_result *res,
                        const uint64_t *offs, uint64_t n, int digest_ok)
{
    vseg *vs = c->vs;
    int no_trailer = vs->sealed && vt->tr != 0;
    if (no_trailer)         /* reported once, where the readable frames stop */
        found(c, res->kind ? res->bad_off : (m->size >= TRAILER_LEN ? m->size - TRAILER_LEN : 0),
              DKV_DAMAGE_BAD_SEAL, res->next_lsn, NO_TRAILER_WHY);
    if (res->kind && !no_trailer) {
        char d[160];
        int kind = dkv__classify_frame(res, vs->sealed, 0, d, sizeof d);
        found(c, res->bad_off, kind, res->next_lsn, d);
    } else if (!res->kind && vs->sealed && vt->tr == 0 && vt->tcrc_ok) {
        seal_finding f[3];
        size_t nf = dkv__check_seal(m->b, m->size, &vt->t, c->base, offs, n, digest_ok, f);
        for (size_t i = 0; i < nf; i++)
            found(c, f[i].off, f[i].kind, f[i].lsn, f[i].why);
    }
}

/* Deep: every COMMIT frame's channel references resolve to earlier entries. */
static int check_commits(vctx *c, const seg_bytes *m, const uint64_t *offs, uint64_t n,
                         ventries *es, dkv_vrefs *vr)
{
    uint32_t seg = (uint32_t)(c->sr - c->r->segments);
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *f = m->b + offs[i];
        if (f[16] != DKV_FRAME_COMMIT)
            continue;
        int oom = 0;
        uint64_t lsn = c->base + i;
        const char *bad = check_commit(es, lsn, f + FRAME_HDR, get32(f + 4), &oom);
        if (!bad && !oom)
            bad = dkv__vrefs_frame(vr, lsn, f + FRAME_HDR, get32(f + 4), seg, offs[i], &oom);
        if (oom)
            return DKV_ENOMEM;
        if (bad)
            found(c, offs[i], DKV_DAMAGE_BROKEN_CHAIN, lsn, bad);
    }
    return 0;
}

/* How many own items entry (lsn, idx) holds: a FULL list entry's or a DELTA's without
 * REFS (an `ir` place may name those, FORMAT.md 5a); -1 for any other or none. */
static int64_t own_items(void *ctx, uint64_t lsn, uint32_t idx)
{
    const ventry *e = ventry_find(ctx, lsn, idx);
    if (!e || !((e->kind == DKV_ENTRY_FULL && !(e->flags & DKV_ENTRY_F_VALUE))
                || (e->kind == DKV_ENTRY_DELTA && !(e->flags & DKV_ENTRY_F_REFS))))
        return -1;
    return e->n_items;
}

/* Deep: every jref and ir place the scan kept, now that the whole log was seen. */
static void check_refs(const dkv_vrefs *vr, ventries *es, dkv_report *r)
{
    char buf[200];
    for (size_t i = 0; i < vr->n_refs; i++) {
        const dkv_vref *x = &vr->refs[i];
        const char *bad = dkv__vrefs_check(vr, x, own_items, es, buf, sizeof buf);
        if (bad)
            add(r, &r->segments[x->seg], r->segments[x->seg].segment, x->off,
                DKV_DAMAGE_BROKEN_CHAIN, x->from, bad);
    }
}

/* Verify one segment file. prev: the previous segment's facts (NULL for the first or after
 * a header we could not read); uuid0: the log's uuid (the first readable header's). */
static int verify_seg(const char *dir, uint64_t base, int last, const vseg *prev, const uint8_t *uuid0,
                      int deep, ventries *es, dkv_vrefs *vr, dkv_report *r,
                      dkv_segment_report *sr, vseg *vs)
{
    vctx c = {.base = base, .expect = prev ? prev->h.base_lsn + prev->count : base, .r = r,
              .sr = sr, .vs = vs};
    dkv__seg_name(c.name, base);
    snprintf(sr->segment, sizeof sr->segment, "%s", c.name);
    sr->base_lsn = base;
    memset(vs, 0, sizeof *vs);
    vs->good_end = HDR_LEN;
    seg_bytes m;
    int rc = read_seg(dir, base, last, &m);
    if (rc)
        return rc;
    sr->bytes = vs->size = m.size;
    uint64_t *offs = NULL;
    size_t n = 0, cap = 0;
    if (check_header(&c, &m, last, prev, uuid0, &rc))
        goto out;
    uint32_t seed = dkv__seed(vs->h.uuid, vs->h.segment_no);
    vtrailer vt;
    read_trailer(&c, &m, last, seed, &vt);
    int trusted = vs->sealed && vt.tr == 0;     /* a trailer that decodes bounds the frames */
    /* One pass over the data for a sealed segment (FORMAT.md §4): check
     * segment_digest first; when it matches, the header and frames are the bytes the writer
     * sealed, so the frame scan only checks structure (lengths, fields, LSN continuity) and
     * skips the per-frame crcs. A mismatch (or deep) runs the per-frame crcs, which locate
     * the damage. The active segment has no digest: its frames are always crc-checked. */
    int digest_ok = trusted && vt.tcrc_ok && vt.t.data_end <= m.size &&
                    dkv_crc32c(seed, m.b, vt.t.data_end) == vt.t.digest;
    scan_result res;
    if ((rc = dkv__scan_ex(m.b, HDR_LEN, trusted ? vt.t.data_end : m.size, seed, base, &offs, &n,
                           &cap, &res, deep || !digest_ok, !vs->sealed)))
        goto out;
    vs->count = sr->frames_ok = n;
    vs->good_end = res.end;
    /* What the next segment is checked against: a damaged segment must not get its intact
     * successor blamed, so a valid trailer (or a clean scan) is trusted, else only order. */
    if (trusted || !res.kind) {
        vs->next_known = 1;
        vs->next_lsn = trusted ? vt.t.last_lsn + 1 : res.next_lsn;
        vs->digest_known = trusted;
    }
    report_scan(&c, &m, &vt, &res, offs, n, digest_ok);
    if (deep)
        rc = check_commits(&c, &m, offs, n, es, vr);
out:
    free(offs);
    release_seg(&m);
    return rc;
}

/* *.seg files whose names are not segment names (reported when no segment is found: the
 * directory then looks like a log, and must not verify as an empty clean one). */
static void report_misnamed(const char *dir, dkv_report *r)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".seg"))
            continue;
        add(r, NULL, e->d_name, 0, DKV_DAMAGE_BAD_HEADER, NO_LSN,
            "not a segment file name (16 hex digits + .seg, e.g. 0000000000000000.seg): "
            "durkv does not read it");
    }
    closedir(d);
}

/* HEAD (as read, hr/why, before the listing) against the segment files verify found. */
static void verify_head(dkv_report *r, vdir_info *info, int hr, const char *why,
                        const uint8_t *uuid0, const uint64_t *bases, size_t n, const vseg *vs)
{
    if (hr == DKV_ECORRUPT || hr == DKV_EIO) {
        info->head_state = 2;
        add(r, NULL, "HEAD", 0, DKV_DAMAGE_BAD_HEADER, NO_LSN, hr == DKV_EIO ? "cannot read HEAD" : why);
    } else if (hr == 0) {
        char name[64], detail[160];
        uint64_t off;
        int kind = dkv__check_head(&info->head, uuid0, n > 0, n ? bases[n - 1] : 0, name, &off,
                                   detail, sizeof detail);
        info->head_state = kind == DKV_DAMAGE_FOREIGN ? 3 : kind == DKV_DAMAGE_MISSING ? 4 : 1;
        /* the newest segments missing lose everything after what is there */
        uint64_t end = !n ? 0 : vs[n - 1].header_ok ? bases[n - 1] + vs[n - 1].count : bases[n - 1];
        if (kind)
            add(r, NULL, name, off, kind, kind == DKV_DAMAGE_MISSING ? end : NO_LSN, detail);
    }
}

static int verify_dir(const char *dir, int deep, dkv_progress_fn progress, void *ctx,
                      dkv_report **out, vseg **vsegs_out, vdir_info *info)
{
    vdir_info scratch;
    if (!info)
        info = &scratch;
    memset(info, 0, sizeof *info);
    *out = NULL;
    uint64_t *bases = NULL;
    size_t n = 0;
    struct stat st;
    int e = stat(dir, &st) ? errno : 0;
    if (e && e != ENOENT && e != ENOTDIR)
        return dkv__io_error(NULL, e, "cannot read %s", dir);
    if (e || !S_ISDIR(st.st_mode)) {
        dkv__set_error(NULL, "no log at %s: %s", dir, e ? strerror(e) : "not a directory");
        return DKV_ENOENT;
    }
    /* HEAD before the listing: a writer names a segment in HEAD only once its file exists */
    const char *why = "";
    int hr = dkv__head_read(dir, &info->head, &why);
    int lrc = dkv__list_segments(dir, &bases, &n);
    if (lrc)
        return dkv__io_error(NULL, -lrc, "cannot list %s", dir);
    dkv_report *r = calloc(1, sizeof *r);
    vseg *vs = calloc(n ? n : 1, sizeof *vs);
    if (r)
        r->segments = calloc(n ? n : 1, sizeof *r->segments);
    if (!r || !vs || !r->segments) {
        free(bases);
        free(vs);
        dkv_report_free(r);
        return DKV_ENOMEM;
    }
    r->n_segments = n;
    ventries es = {0};
    dkv_vrefs vr = {.open = NO_LSN};
    int rc = 0;
    const uint8_t *uuid0 = NULL;
    int prefix_ok = 1;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t before = r->n_damage;
        const vseg *prev = i && vs[i - 1].header_ok ? &vs[i - 1] : NULL;
        rc = verify_seg(dir, bases[i], i + 1 == n, prev, uuid0, deep, &es, &vr, r,
                        &r->segments[i], &vs[i]);
        if (!uuid0 && vs[i].header_ok)
            uuid0 = vs[i].h.uuid;
        r->frames_ok += r->segments[i].frames_ok;
        if (prefix_ok && vs[i].header_ok)
            r->next_lsn = bases[i] + vs[i].count;
        if (r->n_damage > before)
            prefix_ok = 0;
        if (progress)
            progress(ctx, i + 1, n);
    }
    if (!rc && n && vs[n - 1].header_ok && bases[0] > vs[n - 1].h.start_lsn) {
        info->prefix_missing = 1;
        add_range(r, NULL, r->segments[0].segment, 0, DKV_DAMAGE_MISSING, vs[n - 1].h.start_lsn,
                  bases[0] - 1, "segments holding lsns from start_lsn are missing");
    }
    if (!rc && deep)
        check_refs(&vr, &es, r);
    /* HEAD (FORMAT.md §2a): the newest segment it names must be there */
    verify_head(r, info, rc ? DKV_ENOENT : hr, why, uuid0, bases, n, vs);
    if (!rc && n == 0 && info->head_state == 0)
        report_misnamed(dir, r);
    free(es.v);
    dkv__vrefs_free(&vr);
    free(bases);
    if (rc) {
        dkv_report_free(r);
        free(vs);
        return rc;
    }
    *out = r;
    if (vsegs_out)
        *vsegs_out = vs;
    else
        free(vs);
    return 0;
}

int dkv_verify(const char *dir, int deep, dkv_progress_fn progress, void *ctx,
               dkv_report **out)
{
    dkv__set_error(NULL, "%s", "");
    return verify_dir(dir, deep, progress, ctx, out, NULL, NULL);
}

/* Copy [off, end) of a segment to quarantine/, then truncate it there and fsync. */
static int cut_file(const char *dir, const char *name, uint64_t off)
{
    char path[DKV_PATH_MAX];
    int fd = dkv__path(path, dir, "%s", name) ? -1 : open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t *b = NULL;
    uint64_t size;
    int rc = dkv__read_file(fd, &b, &size);
    if (!rc)
        rc = dkv__quarantine_tail(dir, name, fd, b, size, off);
    free(b);
    close(fd);
    return rc;
}

/* After recover cut the log (beyond a torn tail): a writer handle on the lock recover holds
 * raises start_lsn past a missing prefix, seals a segment that was cut in place (so new
 * frames never take the cut LSNs at the offsets they had: a reader still holding the file
 * finds the footer there, not another frame), and points HEAD at the active segment with
 * the new repair epoch. Takes over lfd. */
static int finish_repair(const char *dir, int lfd, uint64_t epoch, int reseal)
{
    dkv_log *log = NULL;
    int rc = dkv__open_repair(dir, lfd, &log);
    if (!rc) {
        log->epoch = epoch;
        /* a prefix missing before the cut -- or by it: the newest segment, whose header
         * alone held a compaction's raised start_lsn, quarantined, an older header (start
         * 0) rules, but the segments below were unlinked by that compaction. Either way
         * the start goes past them */
        if (log->segs[0].base_lsn > log->start_lsn)
            rc = dkv_seal(log, log->segs[0].base_lsn);
        else if (reseal)
            rc = dkv_seal(log, 0);
        if (!rc)
            rc = dkv__head_update(log) ? DKV_EIO : 0;
    }
    int crc = dkv_close(log);
    dkv_destroy(log);
    return rc ? rc : crc;
}

/* recover takes the writer lock: no writer may run while it moves files. */
static int take_writer_lock(const char *dir, int *lfd)
{
    struct stat st;
    if (stat(dir, &st)) {
        dkv__set_error(NULL, "no log at %s: %s", dir, strerror(errno));
        return DKV_ENOENT;
    }
    char lp[DKV_PATH_MAX];
    *lfd = dkv__path(lp, dir, "LOCK") ? -1 : open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*lfd < 0)
        return dkv__io_error(NULL, errno, "cannot open %s (recover takes the writer lock)", lp);
    if (flock(*lfd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(*lfd);
        *lfd = -1;
        return e == EWOULDBLOCK ? DKV_ELOCKED : dkv__io_error(NULL, e, "cannot lock %s", lp);
    }
    return 0;
}

/* Where recover cuts the log: at the first damage in file order. */
typedef struct {
    size_t si;              /* the first damaged segment (n_segments: none) */
    dkv_segment_report *sr; /*   its report, NULL if none */
    int torn;               /* it is a torn tail of the newest segment */
    int whole;              /* the whole segment goes (else cut at `cut`) */
    uint64_t cut;
    uint64_t lost;          /* first LSN the cut loses */
} cut_plan;

/* Plan the cut, and exactly what it loses: from the end of what stays (a whole segment
 * cut loses from the end of the previous one: a missing segment before it is lost too). */
static void plan_cut(const dkv_report *r, const vseg *vs, cut_plan *p)
{
    memset(p, 0, sizeof *p);
    while (p->si < r->n_segments && !r->segments[p->si].kind)
        p->si++;
    p->lost = r->next_lsn;
    if (p->si == r->n_segments)
        return;
    size_t si = p->si;
    dkv_segment_report *sr = p->sr = &r->segments[si];
    p->torn = sr->kind == DKV_DAMAGE_TORN_TAIL && si + 1 == r->n_segments;
    /* Whole segment goes when its header cannot be trusted, or when nothing good is left in
     * it; otherwise cut after its last good frame (which drops a damaged seal too). */
    p->whole = !vs[si].header_ok || sr->bad_offset < HDR_LEN ||
               (!p->torn && vs[si].good_end <= HDR_LEN);
    p->cut = p->whole ? 0 : vs[si].good_end;
    if (!p->whole)
        p->lost = sr->base_lsn + vs[si].count;
    else if (si && vs[si - 1].header_ok)
        p->lost = r->segments[si - 1].base_lsn + vs[si - 1].count;
    else
        p->lost = sr->base_lsn;
}

/* The report of a repair (or its plan) says what the cut loses. */
static void report_loss(dkv_report *r, const cut_plan *p)
{
    if (!p->sr)
        return;
    for (size_t i = 0; i < r->n_damage; i++)
        if (!strcmp(r->damage[i].segment, p->sr->segment)) {
            r->damage[i].lost_first_lsn = p->lost;
            break;
        }
    r->next_lsn = p->lost;
}

/* A repair's new epoch (FORMAT.md §2a): one above HEAD's, or a random one if HEAD was
 * unreadable (a reader's epoch must not match by chance). */
static uint64_t next_epoch(const vdir_info *vi)
{
    uint64_t epoch = 1;
    if (vi->head_state == 1 || vi->head_state == 4)
        epoch = vi->head.epoch + 1;
    else if (vi->head_state >= 2 && dkv__random_bytes((uint8_t *)&epoch, sizeof epoch))
        epoch = (uint64_t)time(NULL);
    return epoch;
}

/* HEAD first: it must never name a segment this repair moves away (FORMAT.md §2a). It names
 * the newest of the first `keep` files with a readable header, with `epoch`; with none,
 * it goes too. */
static int rewrite_head(const char *dir, const dkv_report *r, const vseg *vs,
                        const vdir_info *vi, size_t keep, uint64_t epoch)
{
    while (keep && !vs[keep - 1].header_ok)
        keep--;
    if (keep) {
        log_head h;
        memcpy(h.uuid, vs[keep - 1].h.uuid, 16);
        h.segment_no = vs[keep - 1].h.segment_no;
        h.base_lsn = r->segments[keep - 1].base_lsn;
        h.epoch = epoch;
        return dkv__head_write(dir, &h);
    }
    return vi->head_state ? dkv__quarantine_whole(dir, "HEAD") : 0;   /* nothing stays */
}

/* A torn tail: cut in place, nothing else changes. A torn segment header (the newest file
 * never got going) goes whole, as open moves it; if HEAD named that file it names the one
 * before again, what it held before the file was created (same epoch: no LSN changes). */
static int repair_torn_tail(const char *dir, const dkv_report *r, const vseg *vs,
                            const vdir_info *vi, const cut_plan *p)
{
    if (!p->whole)
        return cut_file(dir, p->sr->segment, p->cut);
    int rc = 0;
    if (vi->head_state == 1 && vi->head.base_lsn == p->sr->base_lsn)
        rc = rewrite_head(dir, r, vs, vi, p->si, vi->head.epoch);
    return rc ? rc : dkv__quarantine_whole(dir, p->sr->segment);
}

/* Every segment after the cut goes whole (newest first), then the damaged one is cut or
 * goes. *moving: the file a failure was about. 0 or -errno. */
static int move_damaged(const char *dir, const dkv_report *r, const cut_plan *p,
                        const char **moving)
{
    int rc = 0;
    for (size_t i = r->n_segments; !rc && i-- > p->si + 1;)
        rc = dkv__quarantine_whole(dir, *moving = r->segments[i].segment);
    if (rc)
        return rc;
    *moving = p->sr->segment;
    return p->whole ? dkv__quarantine_whole(dir, p->sr->segment)
                    : cut_file(dir, p->sr->segment, p->cut);
}

/* Remove the transient files a writer killed mid-way leaves (FORMAT.md §1, §2a): a
 * <segment>.tmp (a segment being created: its header, no frame) and HEAD.tmp (HEAD's next
 * version). No reader lists them and they hold no frame; under the exclusive writer lock
 * nobody is making one. *n: how many were removed (dry_run: found, none removed), for the
 * operator's report. 0, or a DKV_E* code (the error message set). */
static int remove_transients(const char *dir, int dry_run, uint64_t *n)
{
    DIR *d = opendir(dir);
    if (!d && dry_run)
        return 0;                   /* the verify that follows names what is wrong */
    if (!d)
        return dkv__io_error(NULL, errno, "cannot list %s", dir);
    int rc = 0, removed = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        const char *s = e->d_name;
        int seg_tmp = strlen(s) == 24 && strspn(s, "0123456789abcdef") == 16
                      && !strcmp(s + 16, ".seg.tmp");
        if (!seg_tmp && strcmp(s, "HEAD.tmp"))
            continue;
        char p[DKV_PATH_MAX];
        if (dkv__path(p, dir, "%s", s))
            continue;
        if (dry_run)
            (*n)++;
        else if (!unlink(p))
            removed++, (*n)++;
        else if (errno != ENOENT)
            rc = dkv__io_error(NULL, errno, "cannot remove %s (a file a writer killed while "
                               "creating it left; it holds no frame)", p);
    }
    closedir(d);
    int f = !rc && removed ? dkv__dirfsync(dir) : 0;
    return f ? dkv__io_error(NULL, -f, "cannot fsync %s", dir) : rc;
}

int dkv_recover(const char *dir, int skip_corrupt, int dry_run, dkv_progress_fn progress,
                void *ctx, dkv_report **out)
{
    *out = NULL;
    dkv__set_error(NULL, "%s", "");
    int lfd = -1;
    uint64_t transients = 0;
    int rc = dry_run ? 0 : take_writer_lock(dir, &lfd);
    if (!rc)
        rc = remove_transients(dir, dry_run, &transients);
    if (rc) {
        if (lfd >= 0)
            close(lfd);
        return rc;
    }
    vseg *vs = NULL;
    dkv_report *r;
    vdir_info vi;
    if ((rc = verify_dir(dir, 0, progress, ctx, &r, &vs, &vi)))
        goto done;
    *out = r;
    r->transients = transients;
    if (!r->n_damage)
        goto done;
    if (r->n_segments == 0 && vi.head_state == 0) {
        rc = DKV_ENOENT;            /* misnamed *.seg files only: no log, nothing ours to move */
        goto done;
    }
    /* Findings outside the segment files: a missing prefix, a bad HEAD or the newest
     * segments missing. Only --skip-corrupt accepts them (raising start_lsn, rewriting HEAD). */
    int outside = vi.prefix_missing || vi.head_state >= 2;
    cut_plan p;
    plan_cut(r, vs, &p);
    if ((!p.torn || outside) && !skip_corrupt) {
        rc = DKV_ECORRUPT;
        goto done;
    }
    report_loss(r, &p);
    if (dry_run)
        goto done;
    if (p.torn && !outside) {
        if ((rc = repair_torn_tail(dir, r, vs, &vi, &p)))
            rc = dkv__io_error(NULL, -rc, "cannot move the damaged part of %s/%s to "
                               "%s/quarantine/", dir, p.sr->segment, dir);
        goto done;
    }
    uint64_t epoch = next_epoch(&vi);
    const char *moving = "HEAD";
    size_t keep = p.sr ? (p.whole ? p.si : p.si + 1) : r->n_segments;   /* files that stay */
    rc = rewrite_head(dir, r, vs, &vi, keep, epoch);
    if (!rc && p.sr)
        rc = move_damaged(dir, r, &p, &moving);
    if (rc) {
        rc = strcmp(moving, "HEAD")
             ? dkv__io_error(NULL, -rc, "cannot move the damaged part of %s/%s to %s/quarantine/",
                             dir, moving, dir)
             : dkv__io_error(NULL, -rc, "cannot rewrite %s/HEAD", dir);
        goto done;
    }
    rc = finish_repair(dir, lfd, epoch, p.sr && !p.whole);
    lfd = -1;
done:
    free(vs);
    if (lfd >= 0)
        close(lfd);
    return rc;
}
