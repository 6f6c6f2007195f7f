/* verify and recover: whole-directory checks without the write lock (verify) and the only
 * code that removes damaged bytes (recover), always copying them to quarantine/ first.
 *
 * Every byte of a segment is covered by some check: the header by header_crc, frames by
 * their seeded crc (and LSN continuity), the index and trailer by trailer_crc and by the
 * comparison of the index with the frame scan, the whole segment by segment_digest, and
 * the order of files by the chain (uuid, segment_no, base_lsn, prev_digest).
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
    uint32_t idx;
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
        if (es->n == es->cap) {
            size_t nc = es->cap ? es->cap * 2 : 1024;
            ventry *v = realloc(es->v, nc * sizeof *v);
            if (!v) {
                *oom = 1;
                return NULL;
            }
            es->v = v;
            es->cap = nc;
        }
        es->v[es->n++] = (ventry){lsn, i, d.kind, d.flags};
    }
    return bad;
}

/* Verify one segment file. prev: the previous segment's facts (NULL for the first or after
 * a header we could not read). */
static int verify_seg(const char *dir, uint64_t base, int last, const vseg *prev, const uint8_t *uuid0,
                      int deep, ventries *es, dkv_report *r, dkv_segment_report *sr, vseg *vs)
{
    char name[64], path[4200];
    dkv__seg_name(name, base);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(sr->segment, sizeof sr->segment, "%s", name);
    sr->base_lsn = base;
    memset(vs, 0, sizeof *vs);
    vs->good_end = HDR_LEN;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return dkv__io_error(NULL, errno, "segment %s is gone since verify listed the directory "
                             "(a writer's compaction unlinks old segments: run verify again); "
                             "cannot open it", path);
    if (fd < 0)
        return dkv__io_error(NULL, errno, "cannot open segment %s", path);
    uint8_t *b = NULL;
    uint64_t size = 0, *offs = NULL, n = 0, cap = 0;
    int rc = 0;
    /* A sealed (not last) segment is mapped rather than copied: verify reads it once,
     * straight from the page cache. Only sealed files are: nothing truncates them while a
     * writer runs (only `recover --skip-corrupt`, which a concurrent verify must not race),
     * whereas the active segment may be cut by a writer's open under us. */
    size_t mapped = 0;
    struct stat st;
    if (!last && fstat(fd, &st) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
            b = m;
            size = (uint64_t)st.st_size;
            mapped = (size_t)st.st_size;
        }
    }
    if (!mapped)
        rc = dkv__read_file(fd, &b, &size);
    close(fd);
    if (rc)
        return dkv__io_error(NULL, -rc, "cannot read segment %s", path);
    sr->bytes = vs->size = size;
    uint64_t expect = prev ? prev->h.base_lsn + prev->count : base;
    const char *why = "";
    if (dkv__header_decode(b, size, &vs->h, &why)) {
        vs->good_end = 0;
        rc = add(r, sr, name, 0, last && size <= HDR_LEN ? DKV_DAMAGE_TORN_TAIL : DKV_DAMAGE_BAD_HEADER,
                 expect, why);
        goto out;
    }
    vs->header_ok = 1;
    sr->segment_no = vs->h.segment_no;
    if (vs->h.base_lsn != base) {
        /* a copy of another segment under this name: nothing in it can be placed, and the
         * next file is checked against what precedes this one (not blamed for it) */
        add(r, sr, name, 40, DKV_DAMAGE_BAD_HEADER, expect, "header base_lsn does not match the file name");
        vs->header_ok = 0;
        vs->good_end = 0;
        goto out;
    } else if (uuid0 && memcmp(vs->h.uuid, uuid0, 16))
        add(r, sr, name, 16, DKV_DAMAGE_FOREIGN, expect, "segment belongs to another log (uuid differs)");
    else if (prev && prev->header_ok && (vs->h.segment_no != prev->h.segment_no + 1 ||
                                         (prev->next_known ? base != prev->next_lsn : base <= prev->h.base_lsn)))
        add(r, sr, name, 32, DKV_DAMAGE_MISSING, expect, "segment_no or base_lsn does not follow the previous segment");
    else if (prev && prev->header_ok && prev->digest_known && vs->h.prev_digest != prev->digest)
        add(r, sr, name, 56, DKV_DAMAGE_FOREIGN, expect, "prev_digest does not match the previous segment");
    uint32_t seed = dkv__seed(vs->h.uuid, vs->h.segment_no);
    seg_trailer t;
    int tr = size >= HDR_LEN + FRAME_HDR + 8 + TRAILER_LEN ?
             dkv__trailer_decode(b + size - TRAILER_LEN, size, base, &t) : -1;
    int tcrc_ok = tr == 0 && dkv__trailer_crc(seed, b + t.data_end, t.count, b + size - TRAILER_LEN) == t.crc;
    vs->sealed = !last || (tr == 0 && tcrc_ok);
    sr->sealed = vs->sealed;
    uint64_t end = size;
    if (vs->sealed && tr != 0) {
        /* reported after the scan below, which tells where the readable frames stop */
    } else if (vs->sealed) {
        end = t.data_end;
        vs->digest = t.digest;
        if (!tcrc_ok)
            add(r, sr, name, t.data_end, DKV_DAMAGE_BAD_SEAL, expect, "trailer checksum mismatch");
    }
    /* One pass over the data for a sealed segment (FORMAT.md section 4): check
     * segment_digest first; when it matches, the header and frames are the bytes the writer
     * sealed, so the frame scan only checks structure (lengths, fields, LSN continuity) and
     * skips the per-frame crcs. A mismatch (or deep) runs the per-frame crcs, which locate
     * the damage. The active segment has no digest: its frames are always crc-checked. */
    int digest_ok = 0;
    if (vs->sealed && tr == 0 && tcrc_ok && t.data_end <= size)
        digest_ok = dkv_crc32c(seed, b, t.data_end) == t.digest;
    scan_result res;
    if ((rc = dkv__scan_ex(b, HDR_LEN, end, seed, base, &offs, &n, &cap, &res, deep || !digest_ok)))
        goto out;
    vs->count = n;
    vs->good_end = res.end;
    if (vs->sealed && tr != 0)
        add(r, sr, name, res.kind ? res.bad_off : (size >= TRAILER_LEN ? size - TRAILER_LEN : 0),
            DKV_DAMAGE_BAD_SEAL, res.next_lsn, "sealed segment has no valid trailer");
    /* What the next segment is checked against: a damaged segment must not get its intact
     * successor blamed, so a valid trailer (or a clean scan) is trusted, else only order. */
    if (vs->sealed && tr == 0) {
        vs->next_known = 1;
        vs->next_lsn = t.last_lsn + 1;
        vs->digest_known = 1;
    } else if (!res.kind) {
        vs->next_known = 1;
        vs->next_lsn = res.next_lsn;
    }
    sr->frames_ok = n;
    if (res.kind && !(vs->sealed && tr != 0)) {     /* an undecodable trailer is reported once */
        int k = res.torn && !vs->sealed ? DKV_DAMAGE_TORN_TAIL
                : res.kind == DKV_DAMAGE_TORN_TAIL ? DKV_DAMAGE_CHECKSUM : res.kind;
        char d[96];
        snprintf(d, sizeof d, "frame of lsn %llu: %s", (unsigned long long)res.next_lsn,
                 vs->sealed ? "bad frame in a sealed segment"
                 : !res.torn ? "bad frame that a later valid frame shows was synced"
                 : res.resync_off == NO_LSN ? "incomplete write at the end of the active segment"
                 : "unsynced tail of the active segment with holes");
        add(r, sr, name, res.bad_off, k, res.next_lsn, d);
    } else if (vs->sealed && tr == 0 && tcrc_ok) {
        if (n != t.count)
            add(r, sr, name, size - TRAILER_LEN + 8, DKV_DAMAGE_BAD_SEAL, res.next_lsn,
                "trailer frame_count differs from the frames found");
        for (uint64_t i = 0; i < n && i < t.count; i++)
            if (get64(b + t.data_end + i * 8) != offs[i]) {
                add(r, sr, name, t.data_end + i * 8, DKV_DAMAGE_BAD_SEAL, base + i,
                    "index entry differs from the frame's offset");
                break;
            }
        if (!digest_ok)
            add(r, sr, name, size - 8, DKV_DAMAGE_BAD_SEAL, base, "segment_digest mismatch");
    }
    if (deep) {
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *f = b + offs[i];
            if (f[16] != DKV_FRAME_COMMIT)
                continue;
            int oom = 0;
            const char *bad = check_commit(es, base + i, f + FRAME_HDR, get32(f + 4), &oom);
            if (oom) {
                rc = DKV_ENOMEM;
                goto out;
            }
            if (bad)
                add(r, sr, name, offs[i], DKV_DAMAGE_BROKEN_CHAIN, base + i, bad);
        }
    }
out:
    free(offs);
    if (mapped)
        munmap(b, mapped);
    else
        free(b);
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

static int verify_dir(const char *dir, int deep, dkv_report **out, vseg **vsegs_out,
                      vdir_info *info)
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
    int rc = 0;
    const uint8_t *uuid0 = NULL;
    int prefix_ok = 1;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t before = r->n_damage;
        const vseg *prev = i && vs[i - 1].header_ok ? &vs[i - 1] : NULL;
        rc = verify_seg(dir, bases[i], i + 1 == n, prev, uuid0, deep, &es, r, &r->segments[i], &vs[i]);
        if (!uuid0 && vs[i].header_ok)
            uuid0 = vs[i].h.uuid;
        r->frames_ok += r->segments[i].frames_ok;
        if (prefix_ok && vs[i].header_ok)
            r->next_lsn = bases[i] + vs[i].count;
        if (r->n_damage > before)
            prefix_ok = 0;
    }
    if (!rc && n && vs[n - 1].header_ok && bases[0] > vs[n - 1].h.start_lsn) {
        info->prefix_missing = 1;
        add_range(r, NULL, r->segments[0].segment, 0, DKV_DAMAGE_MISSING, vs[n - 1].h.start_lsn,
                  bases[0] - 1, "segments holding lsns from start_lsn are missing");
    }
    /* HEAD (FORMAT.md 2a): the newest segment it names must be there */
    if (rc)
        hr = DKV_ENOENT;
    if (hr == DKV_ECORRUPT || hr == DKV_EIO) {
        info->head_state = 2;
        add(r, NULL, "HEAD", 0, DKV_DAMAGE_BAD_HEADER, NO_LSN, hr == DKV_EIO ? "cannot read HEAD" : why);
    } else if (hr == 0 && uuid0 && memcmp(info->head.uuid, uuid0, 16)) {
        info->head_state = 3;
        add(r, NULL, "HEAD", 16, DKV_DAMAGE_FOREIGN, NO_LSN, "HEAD belongs to another log (uuid differs)");
    } else if (hr == 0 && (n == 0 || info->head.base_lsn > bases[n - 1])) {
        info->head_state = 4;
        uint64_t end = !n ? 0 : vs[n - 1].header_ok ? bases[n - 1] + vs[n - 1].count : bases[n - 1];
        char name[64], detail[160];
        dkv__seg_name(name, info->head.base_lsn);
        snprintf(detail, sizeof detail,
                 "HEAD names segment_no %llu at lsn %llu as the newest: the newest segments "
                 "are missing", (unsigned long long)info->head.segment_no,
                 (unsigned long long)info->head.base_lsn);
        add(r, NULL, name, 0, DKV_DAMAGE_MISSING, end, detail);
    } else if (hr == 0) {
        info->head_state = 1;
    }
    if (!rc && n == 0 && info->head_state == 0)
        report_misnamed(dir, r);
    free(es.v);
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

int dkv_verify(const char *dir, int deep, dkv_report **out)
{
    dkv__set_error(NULL, "%s", "");
    return verify_dir(dir, deep, out, NULL, NULL);
}

/* Move a whole segment into quarantine/ (as <name>.0.torn). */
static int quarantine_file(const char *dir, const char *name)
{
    int rc = dkv__mkdir_fsync(dir, "quarantine");
    if (rc)
        return rc;
    char from[4200], to[4400];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    for (int i = 0; i < 1000; i++) {
        if (i)
            snprintf(to, sizeof to, "%s/quarantine/%s.0.torn.%d", dir, name, i);
        else
            snprintf(to, sizeof to, "%s/quarantine/%s.0.torn", dir, name);
        if (access(to, F_OK) == 0)
            continue;
        if (rename(from, to))
            return -errno;
        snprintf(to, sizeof to, "%s/quarantine", dir);
        rc = dkv__dirfsync(to);
        return rc ? rc : dkv__dirfsync(dir);
    }
    return -EEXIST;
}

/* Copy [off, end) of a segment to quarantine/, then truncate it there and fsync. */
static int cut_file(const char *dir, const char *name, uint64_t off)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t *b = NULL;
    uint64_t size;
    int rc = dkv__read_file(fd, &b, &size);
    if (!rc && off < size) {
        rc = dkv__quarantine(dir, name, off, b + off, size - off);
        if (!rc)
            rc = ftruncate(fd, (off_t)off) ? -errno : dkv__fdatasync(fd);
    }
    free(b);
    close(fd);
    return rc;
}

/* After recover cut the log (beyond a torn tail): a writer handle on the lock recover holds
 * raises start_lsn past a missing prefix, seals a segment that was cut in place (so new
 * frames never take the cut LSNs at the offsets they had: a reader still holding the file
 * finds the footer there, not another frame), and points HEAD at the active segment with
 * the new repair epoch. Takes over lfd. */
static int finish_repair(const char *dir, int lfd, uint64_t epoch, int raise_start, int reseal)
{
    dkv_log *log = NULL;
    int rc = dkv__open_repair(dir, lfd, &log);
    if (!rc) {
        log->epoch = epoch;
        if (raise_start && log->segs[0].base_lsn > log->start_lsn)
            rc = dkv_seal(log, log->segs[0].base_lsn);
        else if (reseal)
            rc = dkv_seal(log, 0);
        if (!rc)
            rc = dkv__head_update(log) ? DKV_EIO : 0;
    }
    int crc = dkv_close(log);
    return rc ? rc : crc;
}

int dkv_recover(const char *dir, int skip_corrupt, int dry_run, dkv_report **out)
{
    *out = NULL;
    dkv__set_error(NULL, "%s", "");
    char lp[4200];
    snprintf(lp, sizeof lp, "%s/LOCK", dir);
    int lfd = -1;
    if (!dry_run) {
        struct stat st;
        if (stat(dir, &st)) {
            dkv__set_error(NULL, "no log at %s: %s", dir, strerror(errno));
            return DKV_ENOENT;
        }
        lfd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lfd < 0)
            return dkv__io_error(NULL, errno, "cannot open %s (recover takes the writer lock)", lp);
        if (flock(lfd, LOCK_EX | LOCK_NB)) {
            int e = errno;
            close(lfd);
            return e == EWOULDBLOCK ? DKV_ELOCKED : dkv__io_error(NULL, e, "cannot lock %s", lp);
        }
    }
    vseg *vs = NULL;
    dkv_report *r;
    vdir_info vi;
    int rc = verify_dir(dir, 0, &r, &vs, &vi);
    if (rc)
        goto done;
    *out = r;
    if (!r->n_damage)
        goto done;
    /* Findings outside the segment files: a missing prefix, a bad HEAD or the newest
     * segments missing. Only --skip-corrupt accepts them (raising start_lsn, rewriting HEAD). */
    int outside = vi.prefix_missing || vi.head_state >= 2;
    if (r->n_segments == 0 && vi.head_state == 0) {
        rc = DKV_ENOENT;            /* misnamed *.seg files only: no log, nothing ours to move */
        goto done;
    }
    /* Where the log gets cut: the first damage in file order. */
    size_t si = 0;
    while (si < r->n_segments && !r->segments[si].kind)
        si++;
    int seg_damage = si < r->n_segments;
    dkv_segment_report *sr = seg_damage ? &r->segments[si] : NULL;
    int torn = seg_damage && sr->kind == DKV_DAMAGE_TORN_TAIL && si + 1 == r->n_segments;
    if ((!torn || outside) && !skip_corrupt) {
        rc = DKV_ECORRUPT;
        goto done;
    }
    /* Whole segment goes when its header cannot be trusted, or when nothing good is left in
     * it; otherwise cut after its last good frame (which drops a damaged seal too). */
    int whole = 0;
    uint64_t cut = 0, lost = r->next_lsn;
    if (seg_damage) {
        whole = !vs[si].header_ok || sr->bad_offset < HDR_LEN ||
                (!torn && vs[si].good_end <= HDR_LEN);
        cut = whole ? 0 : vs[si].good_end;
        /* Exactly what the cut loses: from the end of what stays (a whole segment cut loses
         * from the end of the previous one: a missing segment before it is lost too). */
        if (!whole)
            lost = sr->base_lsn + vs[si].count;
        else if (si && vs[si - 1].header_ok)
            lost = r->segments[si - 1].base_lsn + vs[si - 1].count;
        else
            lost = sr->base_lsn;
        for (size_t i = 0; i < r->n_damage; i++)
            if (!strcmp(r->damage[i].segment, sr->segment)) {
                r->damage[i].lost_first_lsn = lost;
                break;
            }
        r->next_lsn = lost;
    }
    if (dry_run)
        goto done;
    if (torn && !outside && !whole) {    /* a torn tail: cut in place, nothing else changes */
        if ((rc = cut_file(dir, sr->segment, cut)))
            rc = dkv__io_error(NULL, -rc, "cannot move the damaged part of %s/%s to "
                               "%s/quarantine/", dir, sr->segment, dir);
        goto done;
    }
    /* HEAD first: it must never name a segment this repair moves away (FORMAT.md 2a). */
    uint64_t epoch = 1;
    if (vi.head_state == 1 || vi.head_state == 4)
        epoch = vi.head.epoch + 1;
    else if (vi.head_state >= 2 && dkv__random_bytes((uint8_t *)&epoch, sizeof epoch))
        epoch = (uint64_t)time(NULL);
    size_t keep = seg_damage ? (whole ? si : si + 1) : r->n_segments;   /* files that stay */
    while (keep && !vs[keep - 1].header_ok)
        keep--;
    const char *moving = "HEAD";
    if (keep) {
        log_head h;
        memcpy(h.uuid, vs[keep - 1].h.uuid, 16);
        h.segment_no = vs[keep - 1].h.segment_no;
        h.base_lsn = r->segments[keep - 1].base_lsn;
        h.epoch = epoch;
        rc = dkv__head_write(dir, &h);
    } else if (vi.head_state) {
        rc = quarantine_file(dir, "HEAD");      /* nothing of this log stays */
    }
    if (seg_damage) {
        for (size_t i = r->n_segments; !rc && i-- > si + 1;)
            rc = quarantine_file(dir, moving = r->segments[i].segment);
        if (!rc) {
            moving = sr->segment;
            rc = whole ? quarantine_file(dir, sr->segment) : cut_file(dir, sr->segment, cut);
        }
    }
    if (rc) {
        rc = strcmp(moving, "HEAD")
             ? dkv__io_error(NULL, -rc, "cannot move the damaged part of %s/%s to %s/quarantine/",
                             dir, moving, dir)
             : dkv__io_error(NULL, -rc, "cannot rewrite %s/HEAD", dir);
        goto done;
    }
    rc = finish_repair(dir, lfd, epoch, vi.prefix_missing, seg_damage && !whole);
    lfd = -1;
done:
    free(vs);
    if (lfd >= 0)
        close(lfd);
    return rc;
}
