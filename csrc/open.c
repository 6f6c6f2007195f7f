/* Opening a log: the writer lock, loading segments (trailers of sealed ones, a scan of the
 * active one), the lazy index load, catch-up with other writers, and refresh for read-only
 * handles. What each recovery mode does with the damage loading finds is recover_open.c's;
 * what a finding IS (torn tail or which corruption) is damage.c's, the same code verify
 * and recover use. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sched.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log_int.h"

/* The holder's pid a lock file records (advisory text, for messages only). */
static void lock_holder(int fd, char pid[32])
{
    snprintf(pid, 32, "?");
    int r = dkv__pread_all(fd, pid, 31, 0);
    if (r > 0) {
        pid[r] = 0;
        pid[strcspn(pid, "\n")] = 0;
    }
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

/* How long a WLOCK waiter's mark in WSHM lasts: it renews it on every poll (at most 1 ms
 * apart), so a waiter killed mid-wait stops asking a lease holder within this. */
#define WANT_NS 5000000u

/* flock(fd, op | LOCK_NB) until it holds or timeout_ms pass: yields first (a commit holds
 * WLOCK for microseconds), then sleeps up to 1 ms at a time. 0, EWOULDBLOCK, ECANCELED
 * (another thread closes the handle: dkv_close waits for this call) or errno.
 * want: 1 for WLOCK, whose every failed poll asks a lease holder to let go (WSHM). */
static int flock_wait(dkv_log *log, int fd, int op, int want)
{
    uint64_t deadline = now_ms() + log->opt.lock_timeout_ms;
    long ns = 20000;
    for (unsigned i = 0;; i++) {
        if (!flock(fd, op | LOCK_NB)) {
            if (want && i)
                dkv__shm_unwant(log);   /* others waiting mark again on their next poll */
            return 0;
        }
        if (errno != EWOULDBLOCK && errno != EINTR)
            return errno;
        if (__atomic_load_n(&log->closed, __ATOMIC_ACQUIRE))
            return ECANCELED;
        if (want)
            dkv__shm_want(log, dkv__mono_ns() + WANT_NS);
        if (now_ms() >= deadline)
            return EWOULDBLOCK;
        if (i < 64) {
            sched_yield();
        } else {
            struct timespec t = {0, ns};
            nanosleep(&t, NULL);
            if (ns < 1000000)
                ns *= 2;
        }
    }
}

/* A writer attaches: LOCK shared for the handle's life (recover and compaction hold it
 * exclusively), and WLOCK opened for its appends (FORMAT.md §12). *alone:
 * no other writer is attached -- LOCK is held exclusively until open shares it (so WSHM
 * is rebuilt by a writer nobody else can be reading it with). */
static int take_lock(dkv_log *log, int *alone)
{
    char p[DKV_PATH_MAX];
    int fd = dkv__path(p, log->dir, "LOCK") ? -1 : open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return dkv__io_error(log, errno, "cannot open %s", p);
    *alone = !flock(fd, LOCK_EX | LOCK_NB);
    int e = *alone ? 0 : flock_wait(log, fd, LOCK_SH, 0);
    if (e) {
        char pid[32];
        lock_holder(fd, pid);
        close(fd);
        if (e == EWOULDBLOCK) {
            dkv__set_error(log, "store is held exclusively (durkv recover or a compaction) by "
                           "pid %s; wait for it to finish, or open read_only=True", pid);
            return DKV_ELOCKED;
        }
        return dkv__io_error(log, e, "cannot lock %s", p);
    }
    log->lock_fd = fd;
    log->wlock_fd = dkv__path(p, log->dir, "WLOCK") ? -1
                                                    : open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (log->wlock_fd < 0)
        return dkv__io_error(log, errno, "cannot open %s", p);
    log->shared = 1;
    return 0;
}

int dkv__wlock_take(dkv_log *log)
{
    int e = flock_wait(log, log->wlock_fd, LOCK_EX, 1);
    if (e == EWOULDBLOCK) {
        char pid[32];
        lock_holder(log->wlock_fd, pid);
        dkv__set_error(log, "the write lock of %s is held by pid %s for over %u ms; that "
                       "process is stuck writing (or raise lock_timeout_ms)", log->dir, pid,
                       log->opt.lock_timeout_ms);
        return DKV_ELOCKED;
    }
    if (e == ECANCELED)
        return dkv__usable(log, 1);     /* closed meanwhile: DKV_ECLOSED */
    if (e)
        return dkv__io_error(log, e, "cannot lock %s/WLOCK", log->dir);
    /* advisory, for messages only: rewritten only when another process wrote its own */
    if (!dkv__shm_holder_is(log, (uint32_t)log->pid)) {
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%d\n", log->pid);
        (void)!pwrite(log->wlock_fd, pid, (size_t)n, 0);
        dkv__shm_set_holder(log, (uint32_t)log->pid);
    }
    return 0;
}

int dkv_exclusive(dkv_log *log, int on)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (__atomic_load_n(&log->closed, __ATOMIC_SEQ_CST))
        return DKV_ECLOSED;
    if (!log->shared && on)
        return 0;
    if (on) {
        /* flock converts by dropping the shared lock first: on failure take it back */
        if (!flock(log->lock_fd, LOCK_EX | LOCK_NB)) {
            log->shared = 2;
            return 0;
        }
        int e = flock_wait(log, log->lock_fd, LOCK_SH, 0);
        if (e == ECANCELED)
            return dkv__usable(log, 0);
        if (e)
            return dkv__io_error(log, e, "cannot re-take the shared lock on %s/LOCK", log->dir);
        dkv__set_error(log, "other processes have %s open for writing; this needs the store "
                       "alone: close them first", log->dir);
        return DKV_ELOCKED;
    }
    if (log->shared == 2 && flock(log->lock_fd, LOCK_SH))
        return dkv__io_error(log, errno, "cannot share %s/LOCK again", log->dir);
    if (log->shared == 2)
        log->shared = 1;
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
        return dkv__damage_record(log, name, s->data_end, DKV_DAMAGE_BAD_SEAL, s->base_lsn,
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

/* ---- loading one segment ---- */

/* Segment s's whole file into a malloc'd buffer; a failure is the handle's I/O error. */
static int read_whole_seg(dkv_log *log, const seg_t *s, uint8_t **b, uint64_t *size)
{
    int rc = dkv__read_file(s->fd, b, size);
    if (!rc)
        return 0;
    char name[64];
    dkv__seg_name(name, s->base_lsn);
    return dkv__io_error(log, -rc, "cannot read segment %s/%s", log->dir, name);
}

/* strict, point_in_time and salvage check every byte of a sealed segment at open (they are
 * the careful modes; tolerate_tail keeps open O(segments) and checks frames on read). On
 * damage the segment is demoted to the prefix of good frames, and lr describes the damage. */
static int check_sealed(dkv_log *log, seg_t *s, load_result *lr, int have_trailer)
{
    uint8_t *b;
    uint64_t size;
    int rc = read_whole_seg(log, s, &b, &size);
    if (rc)
        return rc;
    uint32_t seed = dkv__seed(log->uuid, s->segment_no);
    uint64_t end = have_trailer ? s->data_end : size;
    s->n_index = 0;
    rc = dkv__scan_ex(b, HDR_LEN, end, seed, s->base_lsn, &s->index, &s->n_index, &s->cap_index,
                      &lr->scan, 1, 0);
    if (rc) {
        free(b);
        return rc;
    }
    seal_finding f[3];
    size_t nf = 0;
    if (lr->scan.kind) {
        lr->kind = dkv__classify_frame(&lr->scan, 1, 0, lr->detail, sizeof lr->detail);
        lr->off = lr->scan.bad_off;
    } else if (!have_trailer) {
        f[nf++] = (seal_finding){DKV_DAMAGE_BAD_SEAL, size >= TRAILER_LEN ? size - TRAILER_LEN : 0,
                                 0, NO_TRAILER_WHY};
    } else if (dkv__trailer_crc(seed, b + end, s->count, b + size - TRAILER_LEN) !=
               get32(b + size - 4)) {
        f[nf++] = (seal_finding){DKV_DAMAGE_BAD_SEAL, end, 0, TRAILER_CRC_WHY};
    } else {
        seg_trailer t = {.count = s->count, .data_end = end};
        nf = dkv__check_seal(b, size, &t, s->base_lsn, s->index, s->n_index,
                             dkv_crc32c(seed, b, end) == s->digest, f);
    }
    if (nf) {                       /* open reports the first finding */
        lr->kind = f[0].kind;
        lr->off = f[0].off;
        snprintf(lr->detail, sizeof lr->detail, "%s", f[0].why);
    }
    s->index_loaded = 1;
    if (!lr->kind) {
        free(b);
        return 0;
    }
    s->sealed = 0;
    s->count = s->n_index;
    s->data_end = lr->scan.end;
    lr->file = b;
    lr->size = size;
    return 0;
}

/* Open segment file `base` into a new (not yet counted) segs[] entry: its fd, size and
 * identity. The active (last) segment of a writer opens for writing. */
static int open_seg_file(dkv_log *log, uint64_t base, int is_last, seg_t **out)
{
    if (dkv__segs_reserve(log))
        return DKV_ENOMEM;
    char path[DKV_PATH_MAX];
    int writer = !log->opt.read_only;
    int fd = dkv__seg_path(path, log->dir, base)
                 ? -1 : open(path, (is_last && writer ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return dkv__io_error(log, errno, "cannot open segment %s", path);
    struct stat st;
    fstat(fd, &st);
    seg_t *s = &log->segs[log->nsegs];
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->dev = (uint64_t)st.st_dev;
    s->ino = (uint64_t)st.st_ino;
    s->base_lsn = base;
    s->file_size = (uint64_t)st.st_size;
    *out = s;
    return 0;
}

/* The header of segment s and its link to the segment before (FORMAT.md §2, §4). A
 * finding goes in lr (the caller closes the file), except under salvage, which reads on
 * past a broken link in a file of this log and only reports it. */
static void check_seg_header(dkv_log *log, seg_t *s, int is_last, seg_header *h, load_result *lr)
{
    uint8_t hb[HDR_LEN];
    const char *why = "";
    int r = dkv__pread_all(s->fd, hb, HDR_LEN, 0);
    if (dkv__header_decode(hb, r < 0 ? 0 : (size_t)r, h, &why)) {
        lr->kind = dkv__classify_header(is_last, s->file_size);
        snprintf(lr->detail, sizeof lr->detail, "%s", why);
        return;
    }
    seg_t *p = log->nsegs ? &log->segs[log->nsegs - 1] : NULL;
    seg_link link = {0};
    if (p)
        link = (seg_link){log->uuid, 1, p->segment_no, p->base_lsn, 1, p->base_lsn + p->count,
                          p->sealed, p->digest};
    lr->kind = dkv__check_link(h, s->base_lsn, &link, &lr->off, lr->detail, sizeof lr->detail);
    /* a file of this log in its place, after a missing or replaced segment */
    int link_only = lr->off == HDR_OFF_SEGMENT_NO || lr->off == HDR_OFF_PREV_DIGEST;
    if (lr->kind && link_only && log->opt.recovery == DKV_RECOVER_SALVAGE) {
        /* the first finding is what recovery_damage shows */
        uint64_t from = p->base_lsn + p->count;
        char name[64];
        dkv__seg_name(name, s->base_lsn);
        dkv__damage_read_past(log, name, lr->off, lr->kind, from,
                              s->base_lsn > from ? s->base_lsn - 1 : NO_LSN, lr->detail);
        lr->kind = 0;
        lr->off = 0;
    }
}

/* The newest segment has a trailer (a crash after sealing, before the next segment
 * existed): believe it only if the trailer checksum verifies. 1: it is sealed. */
static int newest_is_sealed(dkv_log *log, seg_t *s)
{
    int had = log->has_damage;
    dkv_damage before = log->damage;
    log->nsegs++;
    if (dkv__load_index(log, s) == 0)
        return 1;
    log->nsegs--;
    s->sealed = 0;
    log->has_damage = had;          /* not damage: the active segment's tail, scanned next */
    log->damage = before;
    log->err[0] = 0;
    return 0;
}

/* Read the file from boff + *have into b[*have, cap), up to *size (*have grows by what was
 * read); a file shorter than *size ends there (*size lowered). 0 or -errno. */
static int chunk_fill(int fd, uint8_t *b, size_t cap, uint64_t boff, size_t *have,
                      uint64_t *size)
{
    uint64_t want = *size - (boff + *have);
    size_t n = want < cap - *have ? (size_t)want : cap - *have;
    int r = n ? dkv__pread_all(fd, b + *have, n, boff + *have) : 0;
    if (r < 0)
        return r;
    *have += (size_t)r;
    if ((size_t)r < n)
        *size = boff + *have;           /* the file shrank under us: it ends here */
    return 0;
}

/* The active segment's clean case, without holding the whole file: its frames are read,
 * crc-checked and indexed in chunks that stay in the CPU's cache, and its running digest is
 * taken as they go (a 35 MB segment read whole cost as much in page faults as in checks).
 * Returns 1 when every frame checked and the rest of the file is the zero slack (s's index,
 * *end, *size and *digest set), 0 when it is not (damage, a torn tail: the caller reads the
 * file whole and classifies it, FORMAT.md §3, §6), or -errno. */
#define SCAN_CHUNK (1u << 20)

static int scan_active_chunked(seg_t *s, uint32_t seed, int want_digest, uint64_t *size,
                               uint64_t *end, uint32_t *digest)
{
    size_t cap = SCAN_CHUNK;
    uint8_t *b = malloc(cap);
    if (!b)
        return -ENOMEM;
    /* b holds the file's [boff, boff + have); the digest has taken [0, dig_off) */
    uint64_t boff = 0, off = HDR_LEN, dig_off = 0, lsn = s->base_lsn;
    size_t have = 0;
    uint32_t dig = seed;
    int rc = chunk_fill(s->fd, b, cap, boff, &have, size);
    s->n_index = 0;
    while (!rc && off < *size) {
        size_t pos = (size_t)(off - boff);
        /* the whole frame in b, when the file holds it: its header, then its length */
        uint64_t need = FRAME_HDR;
        if (have - pos >= FRAME_HDR && get32(b + pos + 4) <= MAX_FRAME_LEN)
            need += get32(b + pos + 4);
        if (have - pos < need && boff + have < *size) {
            if (want_digest)
                dig = dkv_crc32c(dig, b + (dig_off - boff), (size_t)(off - dig_off));
            dig_off = off;
            memmove(b, b + pos, have - pos);
            have -= pos;
            boff = off;
            pos = 0;
            if (need > cap && need <= *size - off) {
                uint8_t *g = realloc(b, (size_t)need);
                if (!g) {
                    rc = -ENOMEM;
                    break;
                }
                b = g;
                cap = (size_t)need;
            }
            if ((rc = chunk_fill(s->fd, b, cap, boff, &have, size)))
                break;
        }
        uint32_t len;
        uint64_t flsn;
        uint8_t type;
        if (dkv__frame_check(b + pos, have - pos, seed, lsn, 0, &len, &flsn, &type))
            break;                      /* the frames end here */
        if (dkv__index_push(s, off)) {
            rc = -ENOMEM;
            break;
        }
        off += FRAME_HDR + len;
        lsn++;
    }
    int clean = 0;
    if (!rc) {
        if (want_digest)            /* b still holds [dig_off, off) */
            dig = dkv_crc32c(dig, b + (dig_off - boff), (size_t)(off - dig_off));
        /* the end of data only if the rest of the file is zero (the slack, §3) */
        clean = dkv__all_zero(b + (off - boff), have - (size_t)(off - boff));
        while (clean && boff + have < *size) {
            boff += have;
            have = 0;
            if ((rc = chunk_fill(s->fd, b, cap, boff, &have, size)))
                break;
            clean = dkv__all_zero(b, have);
        }
    }
    free(b);
    if (rc)
        return rc;
    *end = off;
    *digest = dig;
    return clean;
}

/* The active segment: scan its frames (in chunks, or read whole when they are not clean). A
 * bad frame is classified (torn tail or corruption) into lr; lr->file keeps the bytes for the
 * caller then. */
static int scan_active(dkv_log *log, seg_t *s, const seg_header *h, load_result *lr)
{
    uint32_t seed = dkv__seed(h->uuid, h->segment_no);
    struct stat st;
    uint64_t size = 0, end = 0;
    int rc = fstat(s->fd, &st) ? -errno : 0;
    if (!rc) {
        size = (uint64_t)st.st_size;
        rc = scan_active_chunked(s, seed, !log->opt.read_only, &size, &end, &lr->digest);
    }
    if (rc == 1) {
        lr->chunked = 1;
        s->file_size = size;
        s->count = s->n_index;
        s->data_end = end;
        s->index_loaded = 1;
        lr->size = size;
        lr->scan.end = end;
        lr->scan.next_lsn = s->base_lsn + s->n_index;
        log->nsegs++;
        return 0;
    }
    if (rc < 0) {
        char name[64];
        dkv__seg_name(name, s->base_lsn);
        close(s->fd);
        return dkv__io_error(log, -rc, "cannot read segment %s/%s", log->dir, name);
    }
    s->n_index = 0;
    uint8_t *buf;
    rc = read_whole_seg(log, s, &buf, &size);
    if (rc) {
        close(s->fd);
        return rc;
    }
    s->file_size = size;
    rc = dkv__scan(buf, HDR_LEN, size, seed, s->base_lsn, &s->index, &s->n_index, &s->cap_index,
                   &lr->scan);
    if (rc) {
        free(buf);
        close(s->fd);
        return rc;
    }
    s->count = s->n_index;
    s->data_end = lr->scan.end;
    s->index_loaded = 1;
    lr->file = buf;
    lr->size = size;
    if (lr->scan.kind) {
        /* salvage resyncs on any valid frame after the damage, torn or not (FORMAT.md §6). */
        lr->kind = dkv__classify_frame(&lr->scan, 0, log->opt.recovery == DKV_RECOVER_SALVAGE,
                                       lr->detail, sizeof lr->detail);
        lr->off = lr->scan.bad_off;
    }
    log->nsegs++;
    return 0;
}

/* Read segment `base`'s header and trailer (or scan it if it is the last and unsealed) into
 * a new segs[] entry. Chain checks against the previous entry. Does not act on damage. */
static int load_seg(dkv_log *log, uint64_t base, int is_last, load_result *lr)
{
    memset(lr, 0, sizeof *lr);
    seg_t *s;
    seg_header h;
    int rc = open_seg_file(log, base, is_last, &s);
    if (rc)
        return rc;
    check_seg_header(log, s, is_last, &h, lr);
    if (lr->kind) {
        close(s->fd);
        return 0;
    }
    if (!log->nsegs)
        memcpy(log->uuid, h.uuid, 16);
    s->segment_no = h.segment_no;
    s->start_lsn = h.start_lsn;
    s->prev_digest = h.prev_digest;
    s->flags = h.flags;
    uint64_t size = s->file_size;
    uint8_t tb[TRAILER_LEN];
    seg_trailer t;
    int have_trailer = size >= HDR_LEN + FRAME_HDR + 8 + TRAILER_LEN &&
                       dkv__pread_all(s->fd, tb, TRAILER_LEN, size - TRAILER_LEN) == TRAILER_LEN &&
                       dkv__trailer_decode(tb, size, base, &t) == 0;
    int mode = log->opt.recovery;
    if (have_trailer) {
        s->sealed = 1;
        s->count = t.count;
        s->data_end = t.data_end;
        s->digest = t.digest;
        if (is_last)
            return newest_is_sealed(log, s) ? 0 : scan_active(log, s, &h, lr);
        log->nsegs++;
        return mode == DKV_RECOVER_TOLERATE_TAIL ? 0 : check_sealed(log, s, lr, 1);
    }
    if (is_last)
        return scan_active(log, s, &h, lr);
    if (mode != DKV_RECOVER_TOLERATE_TAIL && mode != DKV_RECOVER_STRICT) {
        log->nsegs++;
        return check_sealed(log, s, lr, 0);
    }
    lr->kind = DKV_DAMAGE_BAD_SEAL;
    lr->off = size >= TRAILER_LEN ? size - TRAILER_LEN : 0;
    snprintf(lr->detail, sizeof lr->detail, NO_TRAILER_WHY);
    close(s->fd);
    return 0;
}

/* The active segment s's running digest (log->seed set): taken by the chunked scan, or over
 * the bytes read whole (a repair may have cut data_end since). */
static uint32_t active_digest(const dkv_log *log, const load_result *lr, const seg_t *s)
{
    return lr->file ? dkv_crc32c(log->seed, lr->file, s->data_end) : lr->digest;
}

/* Load every segment, applying the recovery mode to whatever damage is found. */
static int load_all(dkv_log *log, const uint64_t *bases, size_t n)
{
    int writer = !log->opt.read_only;
    int stop = 0;
    for (size_t i = 0; i < n && !stop; i++) {
        load_result lr;
        int rc = load_seg(log, bases[i], i + 1 == n, &lr);
        dkv__seg_retire(log);
        if (rc)
            return rc;
        char name[64];
        dkv__seg_name(name, bases[i]);
        seg_t *last = log->nsegs ? &log->segs[log->nsegs - 1] : NULL;
        uint64_t expect = last ? last->base_lsn + last->count : 0;
        if (lr.kind)
            rc = dkv__open_damage(log, name, &lr, bases, n, i, expect, &stop);
        int corrupt = lr.kind && lr.kind != DKV_DAMAGE_TORN_TAIL;
        if (!rc && !corrupt && (lr.file || lr.chunked) && writer && !log->opt.read_only) {
            /* the active segment's running digest, for its seal (FORMAT.md §4) */
            log->seed = dkv__seed(log->uuid, last->segment_no);
            log->run_digest = active_digest(log, &lr, last);
        }
        free(lr.file);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- dkv_open: named steps ---- */

static dkv_log *new_handle(const char *dir, const dkv_options *opt, int lock_fd, int repair)
{
    dkv_log *log = calloc(1, sizeof *log);
    if (!log)
        return NULL;
    pthread_mutex_init(&log->mu, NULL);
    pthread_cond_init(&log->cv, NULL);
    pthread_cond_init(&log->flush_cv, NULL);
    log->lock_fd = lock_fd;
    log->wlock_fd = -1;
    log->wfd = -1;
    log->repair = repair;
    log->dir = strdup(dir);
    log->opt = *opt;
    log->broken = 1;            /* until open succeeds */
    dkv__fork_own(log);
    return log;
}

/* Defaults for the zero options, then the ones no default can fix. */
static int check_options(dkv_log *log, const dkv_options *opt)
{
    if (!log->opt.segment_bytes)
        log->opt.segment_bytes = 64u << 20;
    if (!log->opt.flush_interval_ms)
        log->opt.flush_interval_ms = 10;
    if (!log->opt.lock_timeout_ms)
        log->opt.lock_timeout_ms = 10000;
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
    return 0;
}

/* The store directory: there (a reader needs it), or created durably (a writer). */
static int ensure_dir(dkv_log *log, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        dkv__set_error(log, "no log at %s: it is a file, not a store directory", dir);
        return log->opt.read_only ? DKV_ENOENT : DKV_EINVAL;
    }
    if (stat(dir, &st) == 0)
        return 0;
    if (log->opt.read_only) {
        dkv__set_error(log, "no log at %s", dir);
        return DKV_ENOENT;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        int e = errno;
        int rc = dkv__io_error(log, e, "cannot create %s", dir);
        return e == ENOENT ? DKV_ENOENT : rc;
    }
    char parent[DKV_PATH_MAX];
    int rc = dkv__path(parent, dir, "..") ? -errno : dkv__dirfsync(parent);
    return rc ? dkv__io_error(log, -rc, "cannot fsync the parent directory of %s", dir) : 0;
}

/* A log with no segment yet: a new uuid and segment 0 (a writer only). */
static int start_new_log(dkv_log *log)
{
    if (log->opt.read_only) {
        dkv__set_error(log, "no log at %s", log->dir);
        return DKV_ENOENT;
    }
    int rc = dkv__random_bytes(log->uuid, 16);
    if (rc)
        return dkv__io_error(log, -rc, "cannot draw a log uuid");
    return dkv__create_next_segment(log);
}

/* Dead segments left by a crash between a roll and the unlink (FORMAT.md §7). */
static void drop_dead_segments(dkv_log *log)
{
    int removed = 0;
    for (size_t i = 0; i + 1 < log->nsegs; i++) {
        seg_t *s = &log->segs[i];
        if (s->base_lsn + s->count <= log->start_lsn) {
            char path[DKV_PATH_MAX];
            if (!dkv__seg_path(path, log->dir, s->base_lsn))
                unlink(path);
            s->removed = removed = 1;
        }
    }
    if (removed)
        dkv__dirfsync(log->dir);
}

/* A writer takes the newest segment as its active one (or starts a new one after a
 * sealed newest). */
static int become_writer(dkv_log *log)
{
    seg_t *a = &log->segs[log->nsegs - 1];
    log->written_lsn = log->durable_lsn = log->next_lsn;
    int rc = 0;
    if (a->sealed) {
        rc = dkv__create_next_segment(log);
    } else {
        log->wfd = a->fd;
        log->pend_off = a->data_end;
        log->zero_end = a->file_size;   /* past the frames: zero slack (FORMAT.md §3) */
        /* Whatever the last writer left in the page cache becomes durable before the
         * first append records D = next_lsn in its sync_gap (FORMAT.md §3). */
        if ((rc = dkv__fdatasync(a->fd)))
            rc = dkv__io_error(log, -rc, "cannot fdatasync the active segment of %s", log->dir);
    }
    if (!rc)
        drop_dead_segments(log);
    return rc;
}

/* The segments are loaded: the log's LSN range, the prefix check, and a writer's setup. */
static int adopt_segments(dkv_log *log)
{
    seg_t *a = &log->segs[log->nsegs - 1];
    log->next_lsn = a->base_lsn + a->count;
    log->start_lsn = a->start_lsn;
    int rc = 0;
    if (log->segs[0].base_lsn > log->start_lsn && log->segs[0].base_lsn > 0 && !log->repair)
        rc = dkv__open_missing_prefix(log);
    if (!rc && !log->opt.read_only)
        rc = become_writer(log);
    return rc;
}

/* Load the segment files (or start a new log), applying the recovery mode to damage. */
static int open_segments(dkv_log *log, const log_head *head, int head_rc, const char *head_why)
{
    uint64_t *bases = NULL;
    size_t n = 0;
    int rc = dkv__list_segments(log->dir, &bases, &n);
    if (rc)
        return dkv__io_error(log, -rc, "cannot list %s", log->dir);
    if (n == 0) {
        free(bases);
        if (!log->repair && head_rc != DKV_ENOENT)
            /* HEAD says there was a log: every segment is gone, which is not a new store */
            return dkv__damage_record(log, "HEAD", 0, DKV_DAMAGE_MISSING, 0, NO_LSN,
                                      "HEAD exists but the directory holds no segment file");
        return start_new_log(log);
    }
    rc = load_all(log, bases, n);
    if (!rc && log->nsegs > 0 && !log->cut)
        rc = dkv__open_check_head(log, bases, n, *head, head_rc, head_why);
    free(bases);
    if (!rc && log->nsegs == 0) {   /* every file was damage a mode read past */
        if (log->opt.read_only) {
            dkv__set_error(log, "no readable log at %s", log->dir);
            return log->has_damage ? DKV_ECORRUPT : DKV_ENOENT;
        }
        rc = start_new_log(log);
    }
    return rc ? rc : adopt_segments(log);
}

/* A store from before HEAD, or a crash between creating a segment and naming it in HEAD:
 * a writer names the active segment now (FORMAT.md §2a). */
static int name_active_in_head(dkv_log *log)
{
    log_head hd;
    seg_t *a = &log->segs[log->nsegs - 1];
    if (dkv__head_read(log->dir, &hd, NULL) == 0 && hd.segment_no == a->segment_no &&
        hd.base_lsn == a->base_lsn && hd.epoch == log->epoch)
        return 0;
    int rc = dkv__head_update(log);
    if (rc) {
        dkv__set_error(log, "cannot write %s/HEAD: %s", log->dir, strerror(-rc));
        return DKV_EIO;
    }
    return 0;
}

static int open_impl(const char *dir, const dkv_options *opt, int lock_fd, int repair,
                     dkv_log **out)
{
    dkv_log *log = *out = new_handle(dir, opt, lock_fd, repair);
    if (!log) {
        if (lock_fd >= 0)
            close(lock_fd);
        return DKV_ENOMEM;
    }
    if (!log->dir)
        return DKV_ENOMEM;
    int rc = check_options(log, opt);
    if (!rc)
        rc = ensure_dir(log, dir);
    int alone = 0;
    if (!rc && !log->opt.read_only && log->lock_fd < 0)
        rc = take_lock(log, &alone);
    if (!rc && log->shared)
        rc = dkv__shm_map(log);
    /* loading (a scan of the active segment, a torn tail's repair) sees no half-written
     * frame of another writer: it runs under WLOCK, released once the handle is set up */
    if (!rc && log->shared && (rc = dkv__wlock_take(log)) == 0)
        log->wheld = 0;
    if (rc)
        return rc;
    log_head head;
    const char *head_why = "";
    int head_rc = dkv__head_read(dir, &head, &head_why);
    if ((rc = open_segments(log, &head, head_rc, head_why)))
        return rc;
    if (!log->opt.read_only && !repair && (rc = name_active_in_head(log)))
        return rc;
    if (log->shared)
        dkv__shm_check(log, alone);
    if (log->shared && alone && flock(log->lock_fd, LOCK_SH))
        return dkv__io_error(log, errno, "cannot share %s/LOCK", dir);
    if (log->shared)
        flock(log->wlock_fd, LOCK_UN);
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

/* ---- catch-up: a writer picks up what other processes appended (FORMAT.md §12). mu and
 * WLOCK held, nothing pending: no other writer moves the files. ---- */

/* Bytes past the last good frame of the active segment, under WLOCK: a dead writer's torn
 * tail (its frame was never acknowledged). Quarantined first, then cut, as at open. */
static int cut_dead_tail(dkv_log *log, seg_t *a)
{
    char name[64];
    dkv__seg_name(name, a->base_lsn);
    uint8_t *b;
    uint64_t size;
    int rc = dkv__read_file(log->wfd, &b, &size);
    if (!rc) {
        rc = dkv__quarantine_tail(log->dir, name, log->wfd, b, size, a->data_end);
        free(b);
    }
    if (rc)
        return dkv__io_error(log, -rc, "cannot repair the torn tail of %s/%s (a frame no "
                             "writer acknowledged: one that died, or whose write failed)",
                             log->dir, name);
    a->file_size = log->zero_end = a->data_end;
    return 0;
}

/* Another writer sealed the active segment (its trailer verifies and describes exactly the
 * frames this handle indexed): load the segments it created; the newest becomes active. */
static int adopt_roll(dkv_log *log, seg_t *a, const seg_trailer *t, uint64_t size)
{
    dkv__quiesce(log);      /* no leader or flusher sync of this process is on the old fd */
    a->sealed = 1;
    a->digest = t->digest;
    a->file_size = size;
    a->index_loaded = 1;
    uint64_t *bases = NULL;
    size_t n = 0;
    int rc = dkv__list_segments(log->dir, &bases, &n);
    if (rc)
        return dkv__io_error(log, -rc, "cannot list %s", log->dir);
    uint64_t old_base = a->base_lsn;
    for (size_t i = 0; i < n && !rc; i++) {
        if (bases[i] <= old_base)
            continue;
        load_result lr;
        size_t before = log->nsegs;
        rc = load_seg(log, bases[i], i + 1 == n, &lr);
        if (!rc && lr.kind == DKV_DAMAGE_TORN_TAIL && !lr.file && i + 1 == n) {
            /* a writer died creating this segment (its header is torn): start it again */
            char name[64];
            dkv__seg_name(name, bases[i]);
            if ((rc = dkv__quarantine_whole(log->dir, name)))
                rc = dkv__io_error(log, -rc, "cannot quarantine %s/%s", log->dir, name);
        } else if (!rc && lr.kind && lr.kind != DKV_DAMAGE_TORN_TAIL) {
            char name[64];
            dkv__seg_name(name, bases[i]);
            rc = dkv__damage_record(log, name, lr.off, lr.kind, bases[i], NO_LSN, lr.detail);
        } else if (!rc && log->nsegs > before) {
            seg_t *s = &log->segs[log->nsegs - 1];
            STORE_LSN(log->start_lsn, s->start_lsn);
            STORE_LSN(log->next_lsn, s->base_lsn + s->count);
            log->written_lsn = log->next_lsn;
            if (lr.file || lr.chunked) {    /* the new active segment */
                log->pend_off = s->data_end;
                log->zero_end = s->file_size;
                log->wfd = s->fd;
                log->seed = dkv__seed(log->uuid, s->segment_no);
                log->run_digest = active_digest(log, &lr, s);
            }
        }
        free(lr.file);
        dkv__seg_retire(log);
    }
    free(bases);
    if (rc)
        return rc;
    a = &log->segs[log->nsegs - 1];
    if (a->base_lsn == old_base || a->sealed)
        /* the roller died between its seal and the next segment: create that one */
        return dkv__create_next_segment(log);
    return 0;
}

/* Read what follows segment a's known frames in its file (fd, size bytes) in windows of
 * TAIL_WINDOW bytes and up, indexing the frames it finds (and continuing *digest, if
 * given). A window whose remainder after its frames is all zero, a frame header long or
 * running to the file's end, is the zero slack (FORMAT.md §3, §12): the end. A frame
 * across a window's end, or bad bytes, double the window until it holds the rest of the
 * file; *bad = 1 if that rest is not all zero. */
#define TAIL_WINDOW (4u << 10)
static int read_new_frames(dkv_log *log, seg_t *a, int fd, uint64_t size, uint32_t *digest,
                           int *bad)
{
    uint32_t seed = dkv__seed(log->uuid, a->segment_no);
    *bad = 0;
    uint64_t window = TAIL_WINDOW;
    int whole = 0;
    while (a->data_end < size) {
        uint64_t n = size - a->data_end;
        if (n > window)
            n = window;
        else
            whole = 1;
        uint8_t *b = malloc(n);
        int r = b ? dkv__pread_all(fd, b, n, a->data_end) : -ENOMEM;
        if (r < 0) {
            free(b);
            return r == -ENOMEM ? DKV_ENOMEM
                                : dkv__io_error(log, -r, "cannot read the active segment of %s", log->dir);
        }
        scan_result sr;
        uint64_t *offs = NULL;
        size_t cnt = 0, cap = 0;
        int rc = dkv__scan(b, 0, (uint64_t)r, seed, a->base_lsn + a->count, &offs, &cnt, &cap, &sr);
        for (uint64_t i = 0; !rc && i < cnt; i++)
            rc = dkv__index_push(a, offs[i] + a->data_end);
        free(offs);
        if (!rc && digest)
            *digest = dkv_crc32c(*digest, b, sr.end);
        free(b);
        if (rc) {
            a->n_index = a->count;  /* none of this window's frames is taken */
            return rc;
        }
        a->count = a->n_index;
        a->data_end += sr.end;
        if (sr.kind && !whole) {
            window *= 2;        /* a frame across the window's end, or bad bytes */
            continue;
        }
        if (sr.kind)
            *bad = 1;
        if (!sr.kind && !whole && (uint64_t)r == n && (uint64_t)r - sr.end < FRAME_HDR)
            /* zeros that end the window short of a frame header are not the slack: the
             * next frame's crc may begin with them (its type byte, 16 bytes in, is never
             * 0). The next window starts at them. */
            continue;
        if (sr.kind || sr.end < (uint64_t)r || (uint64_t)r < n)
            break;              /* bad bytes, the zero slack, or the file was shorter */
    }
    return 0;
}

/* Nothing follows the frames this handle knows (the file ends there, or zero slack does),
 * found without an fstat: on Linux 6.13+ a stat makes the next write stamp a fine-grained
 * mtime, and ext4 then writes the inode at the commit's fdatasync -- the very cost the
 * slack saves (FORMAT.md §9). Another writer's frame or seal, or a dead writer's torn
 * bytes, leave a non-zero byte in the 24 after the last frame; a cut file reads short. */
static int tail_untouched(dkv_log *log, const seg_t *a)
{
    uint8_t b[1 + FRAME_HDR];
    int r = dkv__pread_all(log->wfd, b, sizeof b, a->data_end - 1);
    return r >= 1 && dkv__all_zero(b + 1, (uint64_t)r - 1);
}

int dkv__catch_up(dkv_log *log)
{
    for (;;) {
        seg_t *a = &log->segs[log->nsegs - 1];
        if (tail_untouched(log, a))
            return 0;           /* the common case: one pread */
        struct stat st;
        if (fstat(log->wfd, &st))
            return dkv__io_error(log, errno, "cannot stat the active segment of %s", log->dir);
        uint64_t size = (uint64_t)st.st_size;
        if (size == a->data_end)
            return 0;
        if (size < a->data_end) {
            char name[64];
            dkv__seg_name(name, a->base_lsn);
            return dkv__damage_record(log, name, size, DKV_DAMAGE_MISSING, a->base_lsn + a->count,
                                      NO_LSN, "the active segment shrank under a writer");
        }
        int bad;
        int rc = read_new_frames(log, a, log->wfd, size, &log->run_digest, &bad);
        if (rc)
            return rc;
        log->pend_off = a->data_end;
        STORE_LSN(log->next_lsn, a->base_lsn + a->count);
        log->written_lsn = log->next_lsn;
        if (!bad) {
            log->zero_end = size;   /* every byte past the frames is zero (FORMAT.md §12) */
            return 0;
        }
        /* bytes after the last good frame: another writer's seal, or a dead writer's tail */
        uint8_t tb[TRAILER_LEN];
        seg_trailer t;
        if (size >= a->data_end + TRAILER_LEN &&
            dkv__pread_all(log->wfd, tb, TRAILER_LEN, size - TRAILER_LEN) == TRAILER_LEN &&
            dkv__trailer_decode(tb, size, a->base_lsn, &t) == 0 && t.data_end == a->data_end &&
            t.count == a->count && t.digest == log->run_digest) {
            if ((rc = adopt_roll(log, a, &t, size)))
                return rc;
            continue;
        }
        if ((rc = cut_dead_tail(log, a)))
            return rc;
    }
}

/* ---- refresh: read-only handles pick up what a writer appended ---- */

/* Frames appended to the active segment since the handle last looked (what follows them
 * is another frame being written, the zero slack, or a seal: the next refresh looks again). */
static void refresh_active_tail(dkv_log *log, seg_t *a)
{
    struct stat st;
    int bad;
    if (!fstat(a->fd, &st) && (uint64_t)st.st_size > a->data_end)
        (void)read_new_frames(log, a, a->fd, (uint64_t)st.st_size, NULL, &bad);
}

/* The writer rolled past the active segment: it is sealed now. 0 if its seal is not
 * complete yet (try again next time). */
static int refresh_seal(seg_t *a)
{
    uint8_t tb[TRAILER_LEN];
    seg_trailer t;
    struct stat st;
    if (fstat(a->fd, &st) ||
        dkv__pread_all(a->fd, tb, TRAILER_LEN, (uint64_t)st.st_size - TRAILER_LEN) != TRAILER_LEN ||
        dkv__trailer_decode(tb, (uint64_t)st.st_size, a->base_lsn, &t))
        return 0;
    a->sealed = 1;
    a->count = t.count;
    a->data_end = t.data_end;
    a->digest = t.digest;
    a->file_size = (uint64_t)st.st_size;
    a->index_loaded = 0;
    return 1;
}

/* Segments the writer created since (after a, the handle's newest). */
static void refresh_new_segments(dkv_log *log, seg_t *a)
{
    uint64_t *bases = NULL;
    size_t n = 0;
    if (dkv__list_segments(log->dir, &bases, &n))
        return;
    size_t first_new = n;
    for (size_t i = 0; i < n; i++)
        if (bases[i] > a->base_lsn) {
            first_new = i;
            break;
        }
    if (first_new < n && !a->sealed && !refresh_seal(a))
        first_new = n;
    for (size_t i = first_new; i < n; i++) {
        load_result lr;
        size_t before = log->nsegs;
        int rc_load = load_seg(log, bases[i], i + 1 == n, &lr);
        dkv__seg_retire(log);
        free(lr.file);
        if (rc_load || log->nsegs == before)
            break;
        STORE_LSN(log->start_lsn, log->segs[log->nsegs - 1].start_lsn);
    }
    free(bases);
}

int dkv_refresh(dkv_log *log)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = 0;
    if (log->closed || log->broken)
        rc = DKV_ECLOSED;
    if (!rc && !log->opt.read_only && log->shared) {
        /* a writer catches up with other processes' frames: an empty write section */
        if (!(rc = dkv__write_section(log, 1)))
            rc = dkv__write_section(log, 0);
        pthread_mutex_unlock(&log->mu);
        return rc;
    }
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
    if (!a->sealed)
        refresh_active_tail(log, a);
    refresh_new_segments(log, a);
    a = &log->segs[log->nsegs - 1];
    log->written_lsn = a->base_lsn + a->count;
    STORE_LSN(log->durable_lsn, log->written_lsn);
    STORE_LSN(log->next_lsn, log->written_lsn);
    pthread_mutex_unlock(&log->mu);
    return 0;
}
