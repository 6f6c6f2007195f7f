/* Opening a log: the writer lock, loading segments (trailers of sealed ones, a scan of the
 * active one), the segment chain check, recovery modes at open (FORMAT.md section 6),
 * the lazy index load, and refresh for read-only handles. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log_int.h"

int dkv__create_next_segment(dkv_log *log);
void *dkv__flusher_main(void *arg);

static int damage(dkv_log *log, const char *seg, uint64_t off, int kind, uint64_t first,
                  uint64_t last, const char *detail)
{
    dkv_damage *d = &log->damage;
    memset(d, 0, sizeof *d);
    snprintf(d->segment, sizeof d->segment, "%s", seg);
    d->offset = off;
    d->kind = kind;
    d->lost_first_lsn = first;
    d->lost_last_lsn = last;
    snprintf(d->detail, sizeof d->detail, "%s", detail);
    log->has_damage = 1;
    dkv__set_error(log, "segment %s offset %llu: %s (%s)", seg, (unsigned long long)off,
                   dkv_damage_name(kind), detail);
    return DKV_ECORRUPT;
}

static int take_lock(dkv_log *log)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/LOCK", log->dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        return dkv__io_error(log, errno, "cannot open %s", p);
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        char pid[32] = "?";
        int r = dkv__pread_all(fd, pid, sizeof pid - 1, 0);
        if (r > 0) {
            pid[r] = 0;
            pid[strcspn(pid, "\n")] = 0;
        }
        close(fd);
        if (e == EWOULDBLOCK) {
            dkv__set_error(log, "store is locked by pid %s; close it or open read_only=True", pid);
            return DKV_ELOCKED;
        }
        return dkv__io_error(log, e, "cannot lock %s", p);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) == 0 && dkv__pread_all(fd, pid, 0, 0) >= 0)
        (void)!pwrite(fd, pid, (size_t)n, 0);   /* advisory text, for messages only */
    log->lock_fd = fd;
    return 0;
}

int dkv__load_index(dkv_log *log, seg_t *s)
{
    char name[64];
    dkv__seg_name(name, s->base_lsn);
    size_t ilen = (size_t)s->count * 8;
    int fd, own, r = dkv__seg_fd(log, s, &fd, &own);
    if (r)
        return r;
    uint8_t *b = malloc(ilen + TRAILER_LEN);
    r = b ? dkv__pread_all(fd, b, ilen + TRAILER_LEN, s->data_end) : -ENOMEM;
    if (own)
        close(fd);
    if (!b)
        return DKV_ENOMEM;
    const char *why = NULL;
    if (r < 0 || (size_t)r != ilen + TRAILER_LEN)
        why = "cannot read the index";
    else if (dkv__trailer_crc(dkv__seed(log->uuid, s->segment_no), b, s->count, b + ilen) !=
             get32(b + ilen + 44))
        why = "trailer checksum mismatch";
    for (uint64_t i = 0; !why && i < s->count; i++) {
        uint64_t o = get64(b + i * 8);
        uint64_t prev = i ? get64(b + (i - 1) * 8) : 0;
        if ((i == 0 && o != HDR_LEN) || (i && o < prev + FRAME_HDR) || o + FRAME_HDR > s->data_end)
            why = "index entry out of place";
    }
    if (why) {
        free(b);
        return damage(log, name, s->data_end, DKV_DAMAGE_BAD_SEAL, s->base_lsn,
                      s->base_lsn + s->count - 1, why);
    }
    free(s->index);
    s->index = malloc(ilen);
    if (!s->index) {
        free(b);
        return DKV_ENOMEM;
    }
    for (uint64_t i = 0; i < s->count; i++)
        s->index[i] = get64(b + i * 8);
    s->n_index = s->cap_index = s->count;
    s->index_loaded = 1;
    free(b);
    return 0;
}

/* What happened while loading one segment. */
typedef struct {
    int kind;               /* DKV_DAMAGE_NONE: loaded cleanly */
    uint64_t off;
    char detail[160];
    uint8_t *file;          /* the active segment's bytes */
    uint64_t size;
    scan_result scan;
} load_result;

/* strict, point_in_time and salvage check every byte of a sealed segment at open (they are
 * the careful modes; tolerate_tail keeps open O(segments) and checks frames on read). On
 * damage the segment is demoted to the prefix of good frames, and lr describes the damage. */
static int check_sealed(dkv_log *log, seg_t *s, load_result *lr, int have_trailer)
{
    uint8_t *b;
    uint64_t size;
    int rc = dkv__read_file(s->fd, &b, &size);
    if (rc) {
        char name[64];
        dkv__seg_name(name, s->base_lsn);
        return dkv__io_error(log, -rc, "cannot read segment %s/%s", log->dir, name);
    }
    uint32_t seed = dkv__seed(log->uuid, s->segment_no);
    uint64_t end = have_trailer ? s->data_end : size;
    s->n_index = 0;
    rc = dkv__scan(b, HDR_LEN, end, seed, s->base_lsn, &s->index, &s->n_index, &s->cap_index,
                   &lr->scan);
    if (rc) {
        free(b);
        return rc;
    }
    int kind = 0;
    uint64_t off = 0;
    const char *why = "bad frame in a sealed segment";
    if (lr->scan.kind) {
        kind = lr->scan.kind == DKV_DAMAGE_TORN_TAIL ? DKV_DAMAGE_CHECKSUM : lr->scan.kind;
        off = lr->scan.bad_off;
    } else if (!have_trailer) {
        kind = DKV_DAMAGE_BAD_SEAL;
        off = size >= TRAILER_LEN ? size - TRAILER_LEN : 0;
        why = "sealed segment has no valid trailer";
    } else if (dkv__trailer_crc(seed, b + end, s->count, b + size - TRAILER_LEN) !=
               get32(b + size - 4)) {
        kind = DKV_DAMAGE_BAD_SEAL;
        off = end;
        why = "trailer checksum mismatch";
    } else if (s->n_index != s->count) {
        kind = DKV_DAMAGE_BAD_SEAL;
        off = size - TRAILER_LEN + 8;
        why = "trailer frame_count differs from the frames found";
    } else if (dkv_crc32c(seed, b, end) != s->digest) {
        kind = DKV_DAMAGE_BAD_SEAL;
        off = size - 8;
        why = "segment_digest mismatch";
    } else {
        for (uint64_t i = 0; i < s->count && !kind; i++)
            if (get64(b + end + i * 8) != s->index[i]) {
                kind = DKV_DAMAGE_BAD_SEAL;
                off = end + i * 8;
                why = "index entry differs from the frame's offset";
            }
    }
    s->index_loaded = 1;
    if (!kind) {
        free(b);
        return 0;
    }
    s->sealed = 0;
    s->count = s->n_index;
    s->data_end = lr->scan.end;
    lr->kind = kind;
    lr->off = off;
    lr->file = b;
    lr->size = size;
    snprintf(lr->detail, sizeof lr->detail, "%s", why);
    return 0;
}

/* Read segment `base`'s header and trailer (or scan it if it is the last and unsealed) into
 * a new segs[] entry. Chain checks against the previous entry. Does not act on damage. */
static int load_seg(dkv_log *log, uint64_t base, int is_last, load_result *lr)
{
    memset(lr, 0, sizeof *lr);
    if (dkv__segs_reserve(log))
        return DKV_ENOMEM;
    char name[64], path[4200];
    dkv__seg_name(name, base);
    snprintf(path, sizeof path, "%s/%s", log->dir, name);
    int writer = !log->opt.read_only;
    int fd = open(path, (is_last && writer ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        return dkv__io_error(log, errno, "cannot open segment %s", path);
    }
    struct stat st;
    fstat(fd, &st);
    uint64_t size = (uint64_t)st.st_size;
    seg_t *s = &log->segs[log->nsegs];
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->dev = (uint64_t)st.st_dev;
    s->ino = (uint64_t)st.st_ino;
    s->base_lsn = base;
    s->file_size = size;
    uint8_t hb[HDR_LEN];
    seg_header h;
    const char *why = "";
    int r = dkv__pread_all(fd, hb, HDR_LEN, 0);
    if (dkv__header_decode(hb, r < 0 ? 0 : (size_t)r, &h, &why)) {
        lr->kind = (is_last && size <= HDR_LEN) ? DKV_DAMAGE_TORN_TAIL : DKV_DAMAGE_BAD_HEADER;
        snprintf(lr->detail, sizeof lr->detail, "%s", why);
        close(fd);
        return 0;
    }
    seg_t *p = log->nsegs ? &log->segs[log->nsegs - 1] : NULL;
    if (h.base_lsn != base) {
        lr->kind = DKV_DAMAGE_BAD_HEADER;
        snprintf(lr->detail, sizeof lr->detail, "header base_lsn %llu does not match the file name",
                 (unsigned long long)h.base_lsn);
    } else if (p && memcmp(h.uuid, log->uuid, 16)) {
        lr->kind = DKV_DAMAGE_FOREIGN;
        snprintf(lr->detail, sizeof lr->detail, "segment belongs to another log (uuid differs)");
    } else if (p && (h.segment_no != p->segment_no + 1 || base != p->base_lsn + p->count)) {
        lr->kind = DKV_DAMAGE_MISSING;
        snprintf(lr->detail, sizeof lr->detail,
                 "expected segment_no %llu at lsn %llu, found segment_no %llu at lsn %llu",
                 (unsigned long long)p->segment_no + 1, (unsigned long long)(p->base_lsn + p->count),
                 (unsigned long long)h.segment_no, (unsigned long long)base);
    } else if (p && p->sealed && h.prev_digest != p->digest) {
        lr->kind = DKV_DAMAGE_FOREIGN;
        snprintf(lr->detail, sizeof lr->detail, "prev_digest does not match the previous segment");
    }
    if (lr->kind && p && log->opt.recovery == DKV_RECOVER_SALVAGE && h.base_lsn == base &&
        !memcmp(h.uuid, log->uuid, 16)) {
        /* salvage reads on past a broken chain (a missing or replaced segment before this
         * one), but reports it: the first finding is what recovery_damage shows. */
        uint64_t from = p->base_lsn + p->count;
        if (!log->has_damage)
            damage(log, name, lr->kind == DKV_DAMAGE_MISSING ? 32 : 56, lr->kind, from,
                   base > from ? base - 1 : NO_LSN, lr->detail);
        log->err[0] = 0;
        lr->kind = 0;
    }
    if (lr->kind) {
        close(fd);
        return 0;
    }
    if (!p)
        memcpy(log->uuid, h.uuid, 16);
    s->segment_no = h.segment_no;
    s->start_lsn = h.start_lsn;
    s->prev_digest = h.prev_digest;
    uint8_t tb[TRAILER_LEN];
    seg_trailer t;
    int have_trailer = size >= HDR_LEN + FRAME_HDR + 8 + TRAILER_LEN &&
                       dkv__pread_all(fd, tb, TRAILER_LEN, size - TRAILER_LEN) == TRAILER_LEN &&
                       dkv__trailer_decode(tb, size, base, &t) == 0;
    if (have_trailer) {
        s->sealed = 1;
        s->count = t.count;
        s->data_end = t.data_end;
        s->digest = t.digest;
        log->nsegs++;
        if (!is_last)
            return log->opt.recovery == DKV_RECOVER_TOLERATE_TAIL ? 0 : check_sealed(log, s, lr, 1);
        /* The newest segment looks sealed (a crash after sealing, before the next segment
         * existed): believe it only if the trailer checksum verifies. */
        int had = log->has_damage;
        dkv_damage before = log->damage;
        if (dkv__load_index(log, s) == 0)
            return 0;
        log->nsegs--;
        s->sealed = 0;
        log->has_damage = had;      /* not damage: the active segment's tail, scanned below */
        log->damage = before;
        log->err[0] = 0;
    } else if (!is_last && log->opt.recovery != DKV_RECOVER_TOLERATE_TAIL &&
               log->opt.recovery != DKV_RECOVER_STRICT) {
        log->nsegs++;
        return check_sealed(log, s, lr, 0);
    } else if (!is_last) {
        lr->kind = DKV_DAMAGE_BAD_SEAL;
        lr->off = size >= TRAILER_LEN ? size - TRAILER_LEN : 0;
        snprintf(lr->detail, sizeof lr->detail, "sealed segment has no valid trailer");
        close(fd);
        return 0;
    }
    /* The active segment: scan its frames. */
    uint8_t *buf;
    int rc = dkv__read_file(fd, &buf, &size);
    if (rc) {
        close(fd);
        return dkv__io_error(log, -rc, "cannot read %s", path);
    }
    s->file_size = size;
    uint32_t seed = dkv__seed(h.uuid, h.segment_no);
    rc = dkv__scan(buf, HDR_LEN, size, seed, base, &s->index, &s->n_index, &s->cap_index, &lr->scan);
    if (rc) {
        free(buf);
        close(fd);
        return rc;
    }
    s->count = s->n_index;
    s->data_end = lr->scan.end;
    s->index_loaded = 1;
    lr->file = buf;
    lr->size = size;
    if (lr->scan.kind) {
        /* salvage resyncs on any valid frame after the damage, torn or not (section 6). */
        int torn = lr->scan.torn && (log->opt.recovery != DKV_RECOVER_SALVAGE ||
                                     lr->scan.resync_off == NO_LSN);
        lr->kind = torn ? DKV_DAMAGE_TORN_TAIL : lr->scan.kind;
        lr->off = lr->scan.bad_off;
        snprintf(lr->detail, sizeof lr->detail, "%s",
                 !torn ? (lr->scan.torn ? "bad frame followed by valid (unsynced) frames"
                                        : "bad frame that a later valid frame shows was synced")
                 : lr->scan.resync_off == NO_LSN ? "incomplete frame at the end of the active segment"
                 : "unsynced tail of the active segment with holes (no later frame vouches for it)");
    }
    log->nsegs++;
    return 0;
}

/* salvage: index the valid frames after damage in the active segment, leaving 0 for lost LSNs. */
static int salvage_rest(dkv_log *log, seg_t *s, load_result *lr)
{
    scan_result sr = lr->scan;
    uint32_t seed = dkv__seed(log->uuid, s->segment_no);
    while (sr.kind && sr.resync_off != NO_LSN) {
        uint64_t lsn = get64(lr->file + sr.resync_off + 8);
        while (s->base_lsn + s->n_index < lsn)
            if (dkv__index_push(s, 0))
                return DKV_ENOMEM;
        int rc = dkv__scan(lr->file, sr.resync_off, lr->size, seed, lsn, &s->index, &s->n_index,
                           &s->cap_index, &sr);
        if (rc)
            return rc;
        s->data_end = sr.end;
    }
    s->count = s->n_index;
    return 0;
}

/* The highest LSN any segment file shows (for the lost range point_in_time reports). */
static uint64_t last_lsn_on_disk(dkv_log *log, const uint64_t *bases, size_t n)
{
    char path[4200], name[64];
    dkv__seg_name(name, bases[n - 1]);
    snprintf(path, sizeof path, "%s/%s", log->dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t *b = NULL;
    uint64_t size = 0, last = bases[n - 1] ? bases[n - 1] - 1 : NO_LSN;
    seg_header h;
    if (fd >= 0 && dkv__read_file(fd, &b, &size) == 0 && dkv__header_decode(b, size, &h, NULL) == 0) {
        scan_result sr;
        dkv__scan(b, HDR_LEN, size, dkv__seed(h.uuid, h.segment_no), h.base_lsn, NULL, NULL,
                  NULL, &sr);
        if (sr.next_lsn > h.base_lsn)
            last = sr.next_lsn - 1;
    }
    free(b);
    if (fd >= 0)
        close(fd);
    return last;
}

/* Load every segment, applying the recovery mode to whatever damage is found. */
static int load_all(dkv_log *log, const uint64_t *bases, size_t n)
{
    int mode = log->opt.recovery, writer = !log->opt.read_only;
    for (size_t i = 0; i < n; i++) {
        load_result lr;
        int last = i + 1 == n;
        int rc = load_seg(log, bases[i], last, &lr);
        dkv__seg_retire(log);
        if (rc)
            return rc;
        char name[64];
        dkv__seg_name(name, bases[i]);
        uint64_t expect = log->nsegs ? log->segs[log->nsegs - 1].base_lsn + log->segs[log->nsegs - 1].count : 0;
        if (lr.kind == DKV_DAMAGE_TORN_TAIL) {
            seg_t *s = lr.file ? &log->segs[log->nsegs - 1] : NULL;
            int whole = !lr.file;           /* a torn segment header: the file never got going */
            uint64_t off = whole ? 0 : lr.off;
            if (mode == DKV_RECOVER_STRICT) {
                free(lr.file);
                return damage(log, name, off, lr.kind, expect, NO_LSN, lr.detail);
            }
            if (!log->has_damage || mode != DKV_RECOVER_SALVAGE)
                damage(log, name, off, lr.kind, expect, NO_LSN, lr.detail);
            log->err[0] = 0;
            if (writer) {
                char path[4200];
                snprintf(path, sizeof path, "%s/%s", log->dir, name);
                if (whole) {
                    uint8_t *b = NULL;
                    uint64_t sz = 0;
                    int fd = open(path, O_RDONLY | O_CLOEXEC);
                    rc = fd < 0 ? -errno : dkv__read_file(fd, &b, &sz);
                    if (fd >= 0)
                        close(fd);
                    if (!rc)
                        rc = dkv__quarantine(log->dir, name, 0, b, sz);
                    free(b);
                    if (!rc)
                        rc = unlink(path) ? -errno : dkv__dirfsync(log->dir);
                } else {
                    rc = dkv__quarantine(log->dir, name, off, lr.file + off, lr.size - off);
                    if (!rc)
                        rc = ftruncate(s->fd, (off_t)off) ? -errno : dkv__fdatasync(s->fd);
                    s->file_size = off;
                }
                if (rc) {
                    free(lr.file);
                    return dkv__io_error(log, -rc, "cannot repair the torn tail of %s", path);
                }
            }
        } else if (lr.kind) {
            uint64_t off = lr.off;
            if (mode == DKV_RECOVER_SALVAGE && lr.file) {
                seg_t *s = &log->segs[log->nsegs - 1];
                if (!log->has_damage)
                    damage(log, name, off, lr.kind, s->base_lsn + s->count, NO_LSN, lr.detail);
                rc = salvage_rest(log, s, &lr);
                free(lr.file);
                if (rc)
                    return rc;
                continue;
            }
            if (mode == DKV_RECOVER_SALVAGE) {     /* an unreadable header: skip the file */
                if (!log->has_damage)
                    damage(log, name, off, lr.kind, bases[i], NO_LSN, lr.detail);
                continue;
            }
            if (lr.file)
                expect = log->segs[log->nsegs - 1].base_lsn + log->segs[log->nsegs - 1].count;
            rc = damage(log, name, off, lr.kind, expect,
                        mode == DKV_RECOVER_POINT_IN_TIME ? last_lsn_on_disk(log, bases, n) : NO_LSN,
                        lr.detail);
            free(lr.file);
            if (mode != DKV_RECOVER_POINT_IN_TIME && mode != DKV_RECOVER_SALVAGE)
                return rc;
            /* point_in_time: the log ends at the last good frame before the damage, and
             * the handle is read-only until `durkv recover --skip-corrupt` cuts it. */
            log->cut = 1;
            if (writer) {
                log->opt.read_only = 1;
                if (log->lock_fd >= 0)
                    close(log->lock_fd);
                log->lock_fd = -1;
            }
            return 0;
        }
        if (lr.file && writer && !log->opt.read_only) {
            seg_t *s = &log->segs[log->nsegs - 1];
            log->seed = dkv__seed(log->uuid, s->segment_no);
            log->run_digest = dkv_crc32c(log->seed, lr.file, s->data_end);
        }
        free(lr.file);
    }
    return 0;
}

/* A point_in_time or salvage handle that found damage: read-only, no lock. */
static void go_read_only(dkv_log *log)
{
    log->opt.read_only = 1;
    if (log->lock_fd >= 0)
        close(log->lock_fd);
    log->lock_fd = -1;
}

/* HEAD against the segment files (FORMAT.md 2a). hd/rc/why: HEAD as read BEFORE the
 * directory was listed (a writer names a segment in HEAD only once its file exists, so a
 * concurrent roll cannot make HEAD name a file the listing missed). bases: the listing,
 * n > 0. Returns 0 (no finding, or one the mode reads past) or DKV_ECORRUPT / DKV_EIO. */
static int check_head(dkv_log *log, const uint64_t *bases, size_t n, log_head hd, int rc,
                      const char *why)
{
    if (rc == DKV_ENOENT)
        return 0;                   /* a store written before HEAD existed */
    if (rc == DKV_EIO) {
        dkv__set_error(log, "cannot read %s/HEAD", log->dir);
        return DKV_EIO;
    }
    if (rc == 0)
        log->epoch = hd.epoch;
    if (log->repair)
        return 0;                   /* recover rewrites HEAD */
    seg_t *a = &log->segs[log->nsegs - 1];
    char name[64];
    int kind = 0;
    uint64_t first = NO_LSN;
    char detail[160];
    if (rc) {
        kind = DKV_DAMAGE_BAD_HEADER;
        snprintf(name, sizeof name, "HEAD");
        snprintf(detail, sizeof detail, "%s", why);
    } else if (memcmp(hd.uuid, log->uuid, 16)) {
        kind = DKV_DAMAGE_FOREIGN;
        snprintf(name, sizeof name, "HEAD");
        snprintf(detail, sizeof detail, "HEAD belongs to another log (uuid differs)");
    } else if (hd.base_lsn > bases[n - 1]) {
        kind = DKV_DAMAGE_MISSING;
        dkv__seg_name(name, hd.base_lsn);
        first = a->base_lsn + a->count;
        snprintf(detail, sizeof detail,
                 "HEAD names segment_no %llu at lsn %llu as the newest: the newest segments "
                 "are missing", (unsigned long long)hd.segment_no,
                 (unsigned long long)hd.base_lsn);
    }
    if (!kind)
        return 0;
    int mode = log->opt.recovery;
    if (mode == DKV_RECOVER_SALVAGE) {
        if (!log->has_damage)
            damage(log, name, 0, kind, first, NO_LSN, detail);
        log->err[0] = 0;
        return 0;
    }
    if (mode == DKV_RECOVER_POINT_IN_TIME) {
        if (!log->has_damage)
            damage(log, name, 0, kind, first, NO_LSN, detail);
        log->err[0] = 0;
        log->cut = 1;
        go_read_only(log);
        return 0;
    }
    return damage(log, name, 0, kind, first, NO_LSN, detail);
}

static int open_impl(const char *dir, const dkv_options *opt, int lock_fd, int repair,
                     dkv_log **out)
{
    *out = NULL;
    dkv_log *log = calloc(1, sizeof *log);
    if (!log) {
        if (lock_fd >= 0)
            close(lock_fd);
        return DKV_ENOMEM;
    }
    pthread_mutex_init(&log->mu, NULL);
    pthread_cond_init(&log->cv, NULL);
    pthread_cond_init(&log->flush_cv, NULL);
    log->lock_fd = lock_fd;
    log->wfd = -1;
    log->repair = repair;
    log->dir = strdup(dir);
    log->opt = *opt;
    log->broken = 1;            /* until open succeeds */
    *out = log;
    if (!log->dir)
        return DKV_ENOMEM;
    if (!log->opt.segment_bytes)
        log->opt.segment_bytes = 64u << 20;
    if (!log->opt.flush_interval_ms)
        log->opt.flush_interval_ms = 10;
    if (opt->durability < 0 || opt->durability > 2 || opt->recovery < 0 || opt->recovery > 3) {
        dkv__set_error(log, "bad durability (%d) or recovery mode (%d)", opt->durability, opt->recovery);
        return DKV_EINVAL;
    }
    if (log->opt.segment_bytes < HDR_LEN + FRAME_HDR) {
        dkv__set_error(log, "segment_bytes %llu is too small", (unsigned long long)opt->segment_bytes);
        return DKV_EINVAL;
    }
    if (log->opt.recovery == DKV_RECOVER_SALVAGE)
        log->opt.read_only = 1;
    int rc;
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        dkv__set_error(log, "no log at %s: it is a file, not a store directory", dir);
        return log->opt.read_only ? DKV_ENOENT : DKV_EINVAL;
    }
    if (stat(dir, &st)) {
        if (log->opt.read_only) {
            dkv__set_error(log, "no log at %s", dir);
            return DKV_ENOENT;
        }
        if (mkdir(dir, 0755) && errno != EEXIST) {
            int e = errno;
            rc = dkv__io_error(log, e, "cannot create %s", dir);
            return e == ENOENT ? DKV_ENOENT : rc;
        }
        char parent[4200];
        snprintf(parent, sizeof parent, "%s/..", dir);
        if ((rc = dkv__dirfsync(parent)))
            return dkv__io_error(log, -rc, "cannot fsync the parent directory of %s", dir);
    }
    if (!log->opt.read_only && log->lock_fd < 0 && (rc = take_lock(log)))
        return rc;
    log_head head0;
    const char *head_why = "";
    int head_rc = dkv__head_read(dir, &head0, &head_why);
    uint64_t *bases = NULL;
    size_t n = 0;
    if ((rc = dkv__list_segments(dir, &bases, &n))) {
        return dkv__io_error(log, -rc, "cannot list %s", dir);
    }
    if (n == 0) {
        free(bases);
        if (!repair && head_rc != DKV_ENOENT) {
            /* HEAD says there was a log: every segment is gone, which is not a new store */
            return damage(log, "HEAD", 0, DKV_DAMAGE_MISSING, 0, NO_LSN,
                          "HEAD exists but the directory holds no segment file");
        }
        if (log->opt.read_only) {
            dkv__set_error(log, "no log at %s", dir);
            return DKV_ENOENT;
        }
        if ((rc = dkv__random_bytes(log->uuid, 16))) {
            return dkv__io_error(log, -rc, "cannot draw a log uuid");
        }
        rc = dkv__create_next_segment(log);
    } else {
        rc = load_all(log, bases, n);
        if (!rc && log->nsegs == 0) {
            free(bases);
            if (log->opt.read_only) {
                dkv__set_error(log, "no readable log at %s", dir);
                return log->has_damage ? DKV_ECORRUPT : DKV_ENOENT;
            }
            if ((rc = dkv__random_bytes(log->uuid, 16)) == 0)
                rc = dkv__create_next_segment(log);
        } else {
            if (!rc && !log->cut)
                rc = check_head(log, bases, n, head0, head_rc, head_why);
            free(bases);
        }
        if (!rc) {
            seg_t *a = &log->segs[log->nsegs - 1];
            log->next_lsn = a->base_lsn + a->count;
            log->start_lsn = a->start_lsn;
            if (log->segs[0].base_lsn > log->start_lsn && log->segs[0].base_lsn > 0 && !repair) {
                char name[64];
                dkv__seg_name(name, log->segs[0].base_lsn);
                int mode = log->opt.recovery;
                if (mode != DKV_RECOVER_SALVAGE && mode != DKV_RECOVER_POINT_IN_TIME)
                    return damage(log, name, 0, DKV_DAMAGE_MISSING, log->start_lsn,
                                  log->segs[0].base_lsn - 1, "segments below it are missing");
                /* salvage and point_in_time read what remains (from the first segment on)
                 * and report the lost prefix; `recover --skip-corrupt` makes it permanent. */
                if (!log->has_damage)
                    damage(log, name, 0, DKV_DAMAGE_MISSING, log->start_lsn,
                           log->segs[0].base_lsn - 1, "segments below it are missing");
                log->err[0] = 0;
                log->start_lsn = log->segs[0].base_lsn;
                go_read_only(log);
            }
            if (!log->opt.read_only) {
                log->written_lsn = log->durable_lsn = log->next_lsn;
                if (a->sealed)
                    rc = dkv__create_next_segment(log);
                else {
                    log->wfd = a->fd;
                    log->pend_off = a->data_end;
                    /* Whatever the last writer left in the page cache becomes durable before
                     * the first append records D = next_lsn in its sync_gap (FORMAT.md 3). */
                    if ((rc = dkv__fdatasync(a->fd)))
                        rc = dkv__io_error(log, -rc, "cannot fdatasync the active segment of %s",
                                           dir);
                }
                /* Dead segments left by a crash between a roll and the unlink (section 7). */
                int removed = 0;
                for (size_t i = 0; !rc && i + 1 < log->nsegs; i++) {
                    seg_t *s = &log->segs[i];
                    if (s->base_lsn + s->count <= log->start_lsn) {
                        char name[64], path[4200];
                        dkv__seg_name(name, s->base_lsn);
                        snprintf(path, sizeof path, "%s/%s", dir, name);
                        unlink(path);
                        s->removed = removed = 1;
                    }
                }
                if (removed)
                    dkv__dirfsync(dir);
            }
        }
    }
    if (rc)
        return rc;
    if (!log->opt.read_only && !repair) {
        /* A store from before HEAD, or a crash between creating a segment and naming it in
         * HEAD: name the active segment now (FORMAT.md 2a). */
        log_head hd;
        seg_t *a = &log->segs[log->nsegs - 1];
        if (dkv__head_read(dir, &hd, NULL) || hd.segment_no != a->segment_no ||
            hd.base_lsn != a->base_lsn || hd.epoch != log->epoch) {
            if ((rc = dkv__head_update(log))) {
                dkv__set_error(log, "cannot write %s/HEAD: %s", dir, strerror(-rc));
                return DKV_EIO;
            }
        }
    }
    log->written_lsn = log->durable_lsn = log->next_lsn;
    if (!log->opt.read_only) {
        if (pthread_create(&log->flusher, NULL, dkv__flusher_main, log)) {
            dkv__set_error(log, "cannot start the flusher thread");
            return DKV_ENOMEM;
        }
        log->flusher_running = 1;
    }
    log->broken = 0;
    return 0;
}

int dkv_open(const char *dir, const dkv_options *opt, dkv_log **out)
{
    return open_impl(dir, opt, -1, 0, out);
}

int dkv__open_repair(const char *dir, int lock_fd, dkv_log **out)
{
    dkv_options opt = {0};
    opt.durability = DKV_SYNC;
    opt.recovery = DKV_RECOVER_TOLERATE_TAIL;
    return open_impl(dir, &opt, lock_fd, 1, out);
}

/* Read-only handles: pick up what a writer appended (frames, new segments) since. */
int dkv_refresh(dkv_log *log)
{
    pthread_mutex_lock(&log->mu);
    int rc = 0;
    if (log->closed || log->broken)
        rc = DKV_ECLOSED;
    if (rc || !log->opt.read_only || log->cut || log->opt.recovery == DKV_RECOVER_SALVAGE) {
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
    /* `recover` may have cut the log and a writer reused the LSNs since: then what this
     * handle indexed is not the log on disk, and extending it would mix two logs. */
    log_head hd;
    if (dkv__head_read(log->dir, &hd, NULL) == 0 &&
        (hd.epoch != log->epoch || memcmp(hd.uuid, log->uuid, 16))) {
        dkv__set_error(log, "the log at %s was repaired (durkv recover) since this read-only "
                       "handle opened it (repair epoch %llu, now %llu); open it again",
                       log->dir, (unsigned long long)log->epoch, (unsigned long long)hd.epoch);
        pthread_mutex_unlock(&log->mu);
        return DKV_ESTALE;
    }
    seg_t *a = &log->segs[log->nsegs - 1];
    if (!a->sealed) {
        struct stat st;
        if (fstat(a->fd, &st) == 0 && (uint64_t)st.st_size > a->data_end) {
            uint64_t n = (uint64_t)st.st_size - a->data_end;
            uint8_t *b = malloc(n);
            int r = b ? dkv__pread_all(a->fd, b, n, a->data_end) : -ENOMEM;
            if (r > 0) {
                scan_result sr;
                uint64_t *offs = NULL, cnt = 0, cap = 0;
                dkv__scan(b, 0, (uint64_t)r, dkv__seed(log->uuid, a->segment_no),
                          a->base_lsn + a->count, &offs, &cnt, &cap, &sr);
                for (uint64_t i = 0; i < cnt; i++)
                    dkv__index_push(a, offs[i] + a->data_end);
                a->count = a->n_index;
                a->data_end += sr.end;
                free(offs);
            }
            free(b);
        }
    }
    uint64_t *bases = NULL;
    size_t n = 0;
    if (dkv__list_segments(log->dir, &bases, &n) == 0) {
        size_t first_new = n;
        for (size_t i = 0; i < n; i++)
            if (bases[i] > a->base_lsn) {
                first_new = i;
                break;
            }
        if (first_new < n && !a->sealed) {
            uint8_t tb[TRAILER_LEN];
            seg_trailer t;
            struct stat st;
            if (fstat(a->fd, &st) == 0 &&
                dkv__pread_all(a->fd, tb, TRAILER_LEN, (uint64_t)st.st_size - TRAILER_LEN) == TRAILER_LEN &&
                dkv__trailer_decode(tb, (uint64_t)st.st_size, a->base_lsn, &t) == 0) {
                a->sealed = 1;
                a->count = t.count;
                a->data_end = t.data_end;
                a->digest = t.digest;
                a->file_size = (uint64_t)st.st_size;
                a->index_loaded = 0;
            } else {
                first_new = n;      /* the seal is not complete yet: try again next time */
            }
        }
        for (size_t i = first_new; i < n; i++) {
            load_result lr;
            size_t before = log->nsegs;
            int rc_load = load_seg(log, bases[i], i + 1 == n, &lr);
            dkv__seg_retire(log);
            if (rc_load || log->nsegs == before) {
                free(lr.file);
                break;
            }
            free(lr.file);
            STORE_LSN(log->start_lsn, log->segs[log->nsegs - 1].start_lsn);
        }
        free(bases);
    }
    a = &log->segs[log->nsegs - 1];
    log->written_lsn = a->base_lsn + a->count;
    STORE_LSN(log->durable_lsn, log->written_lsn);
    STORE_LSN(log->next_lsn, log->written_lsn);
    pthread_mutex_unlock(&log->mu);
    return 0;
}
