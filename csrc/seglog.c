/* The write and read paths of a log handle: group commit, the async flusher, rolling and
 * sealing segments. Reads are in read.c; opening and recovery at open in open.c.
 *
 * Group commit (LevelDB's writer queue, simplified): appenders encode their frame into
 * the shared `pend` buffer under `mu` and take the next LSN. Whoever then finds no leader
 * becomes it: it swaps `pend` out, writes it with one pwrite and (sync) one fdatasync with
 * `mu` released, then wakes everyone; followers whose LSN is covered return. One buffer is
 * in flight at a time, so file order is LSN order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log_int.h"

#define GROUP_CAP (1u << 20)        /* appenders wait while a leader runs and this much is queued */
/* the try calls (dkv_*_try) refuse to move this much or more with the caller's GIL held:
 * a write that long is worth handing the GIL over */
#define TRY_MAX_BYTES (64u << 10)
#define TRY_LOCK_NS 20000u          /* the try calls spin this long for mu: its ordinary
                                     * holds (a flusher's look, an append) are shorter */
#define EXIT_SPILL (4u << 20)       /* exit policy writes (no fsync) past this much buffered, */
#define EXIT_HARD (32u << 20)       /* in the background (flusher thread) up to this much */

/* ---- fork: a handle belongs to the process that opened it (seglog.h) ---- */

unsigned dkv__fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_child(void) { __atomic_add_fetch(&dkv__fork_gen, 1, __ATOMIC_RELAXED); }
static void fork_install(void) { pthread_atfork(NULL, NULL, fork_child); }

void dkv__fork_own(dkv_log *log)
{
    pthread_once(&fork_once, fork_install);
    log->fork_gen = __atomic_load_n(&dkv__fork_gen, __ATOMIC_RELAXED);
    log->pid = (int)getpid();
}

/* Errors of calls without a handle (dkv_verify, dkv_recover): per calling thread. */
static __thread char thread_err[512];
static __thread int thread_errno;

static void set_error_v(dkv_log *log, int err, const char *fmt, va_list ap)
{
    char *buf = log ? log->err : thread_err;
    size_t cap = log ? sizeof log->err : sizeof thread_err;
    /* the reason survives a message cut short (a long path): it goes in last, whole */
    char why[128] = "";
    if (err)
        snprintf(why, sizeof why, ": %s", strerror(err));
    size_t room = cap - strlen(why);
    int n = vsnprintf(buf, room, fmt, ap);
    size_t at = n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
    memcpy(buf + at, why, strlen(why) + 1);
    if (log)
        log->err_errno = err;
    else
        thread_errno = err;
}

void dkv__set_error(dkv_log *log, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(log, 0, fmt, ap);
    va_end(ap);
}

int dkv__io_error(dkv_log *log, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(log, err, fmt, ap);
    va_end(ap);
    return DKV_EIO;
}

/* The handle's err buffer is this process's copy: writing it touches nothing shared. */
int dkv__forked_error(dkv_log *log)
{
    dkv__set_error(log, "the log %s was opened by process %d and this process (%d) is a fork "
                   "of it: a handle is never used across fork(); open the store again in "
                   "this process (durkv.open after the fork)", log->dir, log->pid, (int)getpid());
    return DKV_EFORKED;
}

const char *dkv_last_error(dkv_log *log) { return log ? log->err : thread_err; }
int dkv_last_errno(dkv_log *log) { return log ? log->err_errno : thread_errno; }

int dkv_last_damage(dkv_log *log, dkv_damage *out)
{
    if (!log || !log->has_damage)
        return DKV_ENOENT;
    *out = log->damage;
    return 0;
}

static seg_t *active(dkv_log *log) { return &log->segs[log->nsegs - 1]; }

/* The pids holding the store's LOCK -- every writer attached to it (FORMAT.md §1: each
 * handle holds a shared flock for as long as it is open) -- from /proc/locks, as "writers
 * attached now: pids 12 (this process), 34"; else a sentence saying they could not be
 * read. Returns how many handles hold it (one line each), -1 when unknown. */
static int lock_holders(const dkv_log *log, char *buf, size_t cap)
{
    struct stat st;
    FILE *f = log->lock_fd < 0 || fstat(log->lock_fd, &st) ? NULL : fopen("/proc/locks", "re");
    if (!f) {
        snprintf(buf, cap, "which processes are attached could not be read: the holders of "
                 "%s/LOCK in /proc/locks", log->dir);
        return -1;
    }
    int pids[32], n = 0, more = 0, holders = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        /* "1: FLOCK  ADVISORY  READ 4242 fe:00:77 0 EOF" (a waiter's line has "->" before
         * FLOCK: not a holder) */
        char type[16];
        int pid;
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*s %15s %*s %*s %d %x:%x:%llu", type, &pid, &maj, &min, &ino) != 5
            || strcmp(type, "FLOCK") || maj != major(st.st_dev) || min != minor(st.st_dev)
            || ino != (unsigned long long)st.st_ino)
            continue;
        holders++;
        int seen = 0;
        for (int i = 0; i < n; i++)
            seen |= pids[i] == pid;
        if (!seen && n < 32)
            pids[n++] = pid;
        else if (!seen)
            more = 1;
    }
    fclose(f);
    size_t at = (size_t)snprintf(buf, cap, "writers attached now: pid%s", n == 1 ? "" : "s");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s %d%s", i ? "," : "", pids[i],
                               pids[i] == (int)getpid() ? " (this process)" : "");
    if (more && at < cap)
        snprintf(buf + at, cap - at, ", ...");
    return holders;
}

/* The error of a failed handle: what failed (failmsg), then what helps. A reopen alone
 * does not help while the disk is full or the process is out of descriptors, nor after a
 * failed fdatasync in a store another handle writes too (WSHM's poison clears only when
 * a writer opens it with no other writer attached: FORMAT.md §12). mu held. */
static int failed_error(dkv_log *log)
{
    const char *fix = NULL;
    switch (log->fail_errno) {
    case ENOSPC: fix = "free space on its file system"; break;
    case EDQUOT: fix = "free space or raise the disk quota"; break;
    case EMFILE: fix = "raise the open-file limit (ulimit -n) or close files"; break;
    case ENFILE: fix = "close files (the system's open-file table is full)"; break;
    case EROFS: fix = "remount its file system read-write"; break;
    case EFBIG: fix = "raise the file-size limit (ulimit -f)"; break;
    }
    char hint[640], pids[200];
    /* this handle alone holds LOCK: its close and a reopen clear the poison */
    if (dkv__shm_poisoned(log) && lock_holders(log, pids, sizeof pids) != 1) {
        snprintf(hint, sizeof hint, "%s%sno writer of this store commits again until EVERY "
                 "handle writing it has been closed (reopening while another stays attached "
                 "does not help): close this one and every other writer (%s), then open the "
                 "store again", fix ? fix : "", fix ? ", and " : "", pids);
    } else {
        snprintf(hint, sizeof hint, "%s%sreopen the store to recover", fix ? fix : "",
                 fix ? ", then " : "");
    }
    dkv__set_error(log, "log failed: %s; %s", log->failmsg, hint);
    log->err_errno = log->fail_errno;
    return DKV_EFAILED;
}

/* A write/sync failure fails the handle for good: fsync is never retried (fsyncgate).
 * `file`: the file it concerns, in the log's directory (NULL: the active segment; "": the
 * directory itself). */
static int fail_at(dkv_log *log, const char *what, const char *file, int neg_errno)
{
    char name[64];
    if (!file) {
        dkv__seg_name(name, active(log)->base_lsn);
        file = name;
    }
    if (!log->failed) {
        snprintf(log->failmsg, sizeof log->failmsg, "%s failed on %s%s%s: %s", what, log->dir,
                 *file ? "/" : "", file, strerror(-neg_errno));
        log->failed = 1;
        log->fail_errno = -neg_errno;
    }
    failed_error(log);
    pthread_cond_broadcast(&log->cv);
    pthread_cond_broadcast(&log->flush_cv);
    return DKV_EIO;
}

static int fail(dkv_log *log, const char *what, int neg_errno)
{
    return fail_at(log, what, NULL, neg_errno);
}

/* Common entry checks, under mu. */
int dkv__usable(dkv_log *log, int write)
{
    /* from dkv_close's start no append begins: its flush covers every frame acknowledged */
    if (log->closed || log->broken || (write == DKV_USE_WRITE && log->shut)) {
        dkv__set_error(log, "log handle is closed");
        return DKV_ECLOSED;
    }
    if (log->failed)
        return failed_error(log);
    if (write && log->opt.read_only) {
        dkv__set_error(log, "log %s is open read-only", log->dir);
        return DKV_EREADONLY;
    }
    return 0;
}

/* Room for one more entry in log->segs (amortized doubling). */
int dkv__segs_reserve(dkv_log *log)
{
    return DKV_RESERVE(log->segs, log->cap_segs, log->nsegs + 1, 16);
}

int dkv__index_push(seg_t *s, uint64_t off)
{
    if (DKV_RESERVE(s->index, s->cap_index, s->n_index + 1, 1024))
        return DKV_ENOMEM;
    s->index[s->n_index++] = off;
    return 0;
}

/* run_digest over a run of encoded frames. A frame is crc || R with crc = crc32c(seed, R),
 * so crc32c(d, frame) = mult(op(|R|), crc32c(d, crc) ^ seed) ^ crc: the frame's own crc
 * stands in for a second pass over its bytes. The operator depends on |R| only; it is
 * cached for the last length seen twice in a row (fixed-size frames), otherwise the bytes
 * are simply crc'd. Leaders are serialized and roll runs without one: no lock needed. */
static uint32_t digest_frames(dkv_log *log, uint32_t d, uint32_t seed, const uint8_t *buf,
                              size_t n)
{
    size_t o = 0;
    while (o + FRAME_HDR <= n) {
        const uint8_t *f = buf + o;
        uint64_t lr = (uint64_t)FRAME_HDR - 4 + get32(f + 4);
        if (o + 4 + lr > n)
            break;
        if (lr >= 256 && lr != log->dg_len && lr == log->dg_last) {
            log->dg_op = dkv__crc32c_op(lr);
            log->dg_len = lr;
        }
        log->dg_last = lr;
        if (lr == log->dg_len) {
            uint32_t c = get32(f);
            d = dkv__crc32c_mult(log->dg_op, dkv_crc32c(d, f, 4) ^ seed) ^ c;
        } else {
            d = dkv_crc32c(d, f, 4 + lr);
        }
        o += 4 + lr;
    }
    return o < n ? dkv_crc32c(d, buf + o, n - o) : d;
}

/* The flusher has work: frames written by async appends that are not yet durable. */
static int flush_due(const dkv_log *log)
{
    return log->flush_want > log->durable_lsn && log->written_lsn > log->durable_lsn;
}

/* Wake the flusher if it sleeps without a deadline and has work (mu held). One already
 * counting down its flush interval will sync this write too (a signal per append would
 * cost every append a futex wake and a context switch on the other core). */
static void wake_flusher(dkv_log *log)
{
    if (log->flusher_idle && flush_due(log)) {
        log->flusher_idle = 0;
        pthread_cond_signal(&log->flush_cv);
    }
}

/* Frames below d are durable (d: an fdatasync's cover, or WSHM's durable): raise the
 * handle's watermark, never past the frames it knows were written. mu held. */
static void raise_durable(dkv_log *log, uint64_t d)
{
    if (d > log->written_lsn)
        d = log->written_lsn;
    if (d > log->durable_lsn)
        STORE_LSN(log->durable_lsn, d);
}

/* Zero slack (FORMAT.md §3, §9): zeros written ahead of the active segment's frames, so
 * that a commit's fdatasync finds the file's size already synced (on ext4 an fdatasync
 * after a size change also commits the journal). */
#define SLACK_MIN (64u << 10)       /* no slack below this much data; the smallest chunk */
#define SLACK_MAX (1u << 20)        /* the largest chunk */
#define SLACK_PIECE (64u << 10)     /* zeros written per pwrite */
static const uint8_t slack_zeros[SLACK_PIECE];

/* Frames were just written up to `end` of the active segment (fd): if they passed the
 * zeros this handle knows, write the next chunk of zeros after them -- no fdatasync: the
 * commit's own syncs it with the frames. Runs where the frames' write did (a leader, or
 * under mu), inside the write section of a shared writer: every byte past the frames'
 * end is zero (FORMAT.md §12), so zeros are written only past the file's size. 0 or -errno. */
static int zero_ahead(dkv_log *log, int fd, uint64_t end)
{
    if (end <= log->zero_end || end < SLACK_MIN)
        return 0;
    uint64_t chunk = end / 8 < SLACK_MIN ? SLACK_MIN : end / 8 > SLACK_MAX ? SLACK_MAX : end / 8;
    uint64_t to = (end + chunk + 4095) & ~(uint64_t)4095;
    if (to > log->opt.segment_bytes)
        to = log->opt.segment_bytes;
    struct stat st;
    if (fstat(fd, &st))
        return -errno;
    uint64_t size = (uint64_t)st.st_size;
    if (size > end || to <= end) {
        /* another process wrote this slack already; or the segment is full (the next
         * frame rolls) */
        log->zero_end = size > end ? size : end;
        return 0;
    }
    for (uint64_t at = end; at < to;) {
        size_t n = to - at < SLACK_PIECE ? (size_t)(to - at) : SLACK_PIECE;
        int rc = dkv__pwrite_all(fd, slack_zeros, n, at);
        if (rc)
            return rc;
        at += n;
    }
    log->zero_end = to;
    return 0;
}

/* Become leader (mu held, no leader running): write everything pending, fdatasync if
 * asked (a shared writer holds the store's syncer turn then, sync_step: given back here),
 * return with mu held. */
static int lead(dkv_log *log, int do_sync)
{
    log->leader = 1;
    uint8_t *buf = log->pend;
    size_t n = log->pend_len, cap = log->pend_cap;
    uint64_t off = log->pend_off, upto = log->next_lsn;
    log->pend = log->spare;
    log->pend_cap = log->spare_cap;
    log->spare = buf;
    log->spare_cap = cap;
    log->pend_len = 0;
    log->pend_off = off + n;
    int fd = log->wfd;
    uint64_t base = active(log)->base_lsn;
    uint32_t digest = log->run_digest, seed = log->seed;
    /* The durable watermark now, just before the write: frames queued while an earlier
     * group was being synced record that group as durable (FORMAT.md §3). */
    uint64_t durable = log->durable_lsn;
    pthread_mutex_unlock(&log->mu);

    dkv__frames_restamp(buf, n, seed, durable);
    int rc = n ? dkv__pwrite_all(fd, buf, n, off) : 0;
    if (!rc && n)
        rc = zero_ahead(log, fd, off + n);                   /* leaders are serialized */
    if (!rc)
        digest = digest_frames(log, digest, seed, buf, n);

    pthread_mutex_lock(&log->mu);
    if (rc) {
        log->leader = 0;
        if (do_sync)
            dkv__shm_turn_release(log);
        return fail(log, "write", rc);
    }
    if (n)      /* an empty group (a sync) leaves a catch-up's digest and tail alone */
        log->run_digest = digest;
    if (upto > log->written_lsn)
        log->written_lsn = upto;
    if (do_sync) {
        /* written: a write section may write the next frames while this fsync runs */
        log->lead_sync = 1;
        pthread_cond_broadcast(&log->cv);
        pthread_mutex_unlock(&log->mu);
        uint64_t cover = dkv__shm_cover(log, base, upto);   /* other processes' frames too */
        rc = dkv__fdatasync(fd);
        dkv__shm_synced(log, cover, !rc, 1);
        pthread_mutex_lock(&log->mu);
        log->lead_sync = 0;
        if (rc) {
            log->leader = 0;
            return fail(log, "fdatasync", rc);
        }
        log->commit_syncs++;
        raise_durable(log, cover);
    }
    log->leader = 0;
    pthread_cond_broadcast(&log->cv);
    wake_flusher(log);
    return 0;
}

/* CLOCK_REALTIME ns from now (pthread_cond_timedwait's clock). */
static struct timespec realtime_in(uint64_t ns)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    ns += (uint64_t)t.tv_nsec;
    t.tv_sec += (time_t)(ns / 1000000000u);
    t.tv_nsec = (long)(ns % 1000000000u);
    return t;
}

/* The lease (FORMAT.md §12): WLOCK kept after a section while no other process wants it. */
#define LEASE_IDLE_NS 1000000u      /* let it go after this long without a section */

/* Let WLOCK go if this process holds it between sections. mu held. */
static void lease_release(dkv_log *log)
{
    if (log->lease) {
        log->lease = 0;
        flock(log->wlock_fd, LOCK_UN);
    }
}

/* The flusher's look at a lease: gone when another process waits, the handle failed or
 * stops, or no section came for LEASE_IDLE_NS. mu held. */
static void lease_tick(dkv_log *log)
{
    if (!log->lease)
        return;
    uint64_t now = dkv__mono_ns();
    if (log->failed || log->stop || dkv__shm_wanted(log, now) || now - log->lease_ns >= LEASE_IDLE_NS)
        lease_release(log);
}

/* One step towards frames below `end` being durable, when no leader of this process runs
 * (mu held): take another process's fdatasync that covered them (WSHM's durable); or, if
 * another process's fdatasync runs, sleep until it publishes (10 ms at most) and look
 * again -- one fsync at a time per store, each covering every frame written while the
 * previous one ran (cross-process group commit); or run the store's next fdatasync. A
 * failed fdatasync anywhere (WSHM's poison) fails the handle. */
static int sync_step(dkv_log *log, uint64_t end)
{
    if (!log->shm)
        return lead(log, 1);
    lease_release(log);     /* this thread now waits for a disk: others may write meanwhile */
    if (dkv__shm_poisoned(log))
        return fail(log, "fdatasync (in another process writing this store)", -EIO);
    raise_durable(log, dkv__shm_durable(log));
    if (log->durable_lsn >= end)
        return 0;
    if (dkv__shm_sync_turn(log))
        return lead(log, 1);            /* its publish gives the turn back */
    log->leader = log->lead_sync = 1;   /* this process's other waiters wait for this one */
    pthread_mutex_unlock(&log->mu);
    dkv__shm_wait(log, end, 10000);
    pthread_mutex_lock(&log->mu);
    log->leader = log->lead_sync = 0;
    pthread_cond_broadcast(&log->cv);
    if (dkv__shm_poisoned(log))
        return fail(log, "fdatasync (in another process writing this store)", -EIO);
    raise_durable(log, dkv__shm_durable(log));
    return 0;
}

/* Wait until no leader, flusher sync or roll runs (mu held). */
void dkv__quiesce(dkv_log *log)
{
    while (log->leader || log->syncing || log->rolling)
        pthread_cond_wait(&log->cv, &log->mu);
}

static int create_segment(dkv_log *log, uint64_t start_lsn, uint32_t prev_digest);

/* Seal the active segment (it has frames) and start the next one. mu held. */
static int roll(dkv_log *log, uint64_t new_start)
{
    /* `rolling` is set before waiting for the leader, so no appender enqueues meanwhile:
     * an append_many's frames keep consecutive LSNs even when a roll splits them. */
    while (log->rolling)
        pthread_cond_wait(&log->cv, &log->mu);
    log->rolling = 1;
    while (log->leader || log->syncing)
        pthread_cond_wait(&log->cv, &log->mu);
    int rc = dkv__usable(log, DKV_USE_UNDERWAY);
    if (rc) {
        log->rolling = 0;
        pthread_cond_broadcast(&log->cv);
        return rc;
    }
    seg_t *a = active(log);
    char name[64];
    dkv__seg_name(name, a->base_lsn);
    /* Write the pending tail: with mu held, nothing else moves meanwhile. */
    dkv__frames_restamp(log->pend, log->pend_len, log->seed, log->durable_lsn);
    rc = log->pend_len ? dkv__pwrite_all(log->wfd, log->pend, log->pend_len, log->pend_off) : 0;
    const char *what = "write";
    if (!rc) {
        log->run_digest = digest_frames(log, log->run_digest, log->seed, log->pend, log->pend_len);
        log->pend_off += log->pend_len;
        log->pend_len = 0;
        log->written_lsn = log->next_lsn;
        size_t flen = (size_t)a->count * 8 + TRAILER_LEN;
        uint8_t *f = malloc(flen);
        if (!f) {
            log->rolling = 0;
            pthread_cond_broadcast(&log->cv);
            return DKV_ENOMEM;
        }
        for (uint64_t i = 0; i < a->count; i++)
            put64(f + i * 8, a->index[i]);
        uint8_t *t = f + a->count * 8;
        memcpy(t, SEAL_MAGIC, 8);
        put64(t + 8, a->count);
        put64(t + 16, a->base_lsn);
        put64(t + 24, a->base_lsn + a->count - 1);
        put64(t + 32, a->data_end);
        put32(t + 40, log->run_digest);
        put32(t + 44, dkv__trailer_crc(log->seed, f, a->count, t));
        /* Frames first, then the footer: a crash in between leaves a torn tail, never a
         * trailer describing frames that are not on disk. */
        rc = dkv__fdatasync(log->wfd);
        what = "fdatasync";
        if (!rc) {
            /* the zero slack goes first: the footer follows the last frame and ends the
             * file (FORMAT.md §4) */
            rc = ftruncate(log->wfd, (off_t)a->data_end) ? -errno : 0;
            what = "ftruncate";
        }
        if (!rc) {
            rc = dkv__pwrite_all(log->wfd, f, flen, a->data_end);
            what = "write";
        }
        if (!rc) {
            rc = dkv__fdatasync(log->wfd);
            what = "fdatasync";
        }
        free(f);
        if (!rc) {
            a->sealed = 1;
            a->index_loaded = 1;
            a->digest = log->run_digest;
            a->file_size = a->data_end + flen;
            a->fd = log->wfd;
            STORE_LSN(log->durable_lsn, log->next_lsn);
            rc = create_segment(log, new_start ? new_start : log->start_lsn, a->digest);
            log->rolling = 0;
            pthread_cond_broadcast(&log->cv);
            return rc;
        }
    }
    log->rolling = 0;
    pthread_cond_broadcast(&log->cv);
    /* the segment other processes of the store wrote too: a failed fdatasync may have
     * dropped their pages, so none acknowledges through a later one (WSHM's poison) */
    if (!strcmp(what, "fdatasync"))
        dkv__shm_synced(log, 0, 0, 0);
    return fail(log, what, rc);
}

/* rename(2) that never replaces an existing file (a stale segment of that name is an error,
 * as O_EXCL made it): 0 or -errno. Where the file system has no RENAME_NOREPLACE, the
 * name is looked up first -- under WLOCK no other writer creates segments. */
static int rename_noreplace(const char *from, const char *to)
{
#ifdef SYS_renameat2
    if (syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 1 /* RENAME_NOREPLACE */) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return -errno;
#endif
    struct stat st;
    if (lstat(to, &st) == 0)
        return -EEXIST;
    if (errno != ENOENT)
        return -errno;
    return rename(from, to) ? -errno : 0;
}

/* Create segment `next_lsn` (header written, fdatasync'd, directory fsync'd). mu held. */
static int create_segment(dkv_log *log, uint64_t start_lsn, uint32_t prev_digest)
{
    seg_header h;
    memcpy(h.uuid, log->uuid, 16);
    h.segment_no = log->nsegs ? active(log)->segment_no + 1 : 0;
    h.base_lsn = log->next_lsn;
    h.start_lsn = start_lsn;
    h.prev_digest = prev_digest;
    h.flags = SEG_FLAGS_NEW;
    if (dkv__segs_reserve(log))
        return DKV_ENOMEM;
    /* The file appears under its name with its header whole (FORMAT.md §1): written and
     * synced as <name>.tmp, then renamed -- never over an existing file. A kill during the
     * creation leaves at most the .tmp (no reader lists it; the next creation of that name
     * truncates it), never a segment shorter than its header. */
    char name[64], path[DKV_PATH_MAX], tmp[DKV_PATH_MAX];
    dkv__seg_name(name, h.base_lsn);
    int fd = dkv__path(path, log->dir, "%s", name) || dkv__path(tmp, log->dir, "%s.tmp", name)
                 ? -1 : open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        if (log->nsegs)
            return fail_at(log, "create segment", name, -e);
        return dkv__io_error(log, e, "cannot create segment %s", path);
    }
    uint8_t hb[HDR_LEN];
    dkv__header_encode(&h, hb);
    const char *what = "write";
    int rc = dkv__pwrite_all(fd, hb, HDR_LEN, 0);
    if (!rc) {
        what = "fdatasync";
        rc = dkv__fdatasync(fd);
    }
    if (!rc) {
        what = "create segment";
        rc = rename_noreplace(tmp, path);
    }
    if (rc) {
        /* no segment was made: the handle keeps its active one (and fails) */
        close(fd);
        unlink(tmp);
        if (log->nsegs)
            return fail_at(log, what, name, rc);
        return dkv__io_error(log, -rc, "cannot create segment %s (%s)", path, what);
    }
    what = "directory fsync";
    const char *file = "";      /* the directory */
    rc = dkv__dirfsync(log->dir);
    seg_t *s = &log->segs[log->nsegs++];
    memset(s, 0, sizeof *s);
    s->base_lsn = h.base_lsn;
    s->segment_no = h.segment_no;
    s->start_lsn = start_lsn;
    s->prev_digest = prev_digest;
    s->flags = h.flags;
    s->data_end = HDR_LEN;
    s->file_size = HDR_LEN;
    s->index_loaded = 1;
    s->fd = fd;
    struct stat st;
    if (!fstat(fd, &st)) {
        s->dev = (uint64_t)st.st_dev;
        s->ino = (uint64_t)st.st_ino;
    }
    log->wfd = fd;
    log->seed = dkv__seed(log->uuid, h.segment_no);
    log->run_digest = dkv_crc32c(log->seed, hb, HDR_LEN);
    log->pend_off = log->zero_end = HDR_LEN;
    STORE_LSN(log->start_lsn, start_lsn);
    /* HEAD names the new segment before any of its frames is acknowledged (FORMAT.md §2a) */
    if (!rc) {
        what = "HEAD update";
        file = "HEAD";
        rc = dkv__head_update(log);
    }
    if (!rc)
        dkv__shm_rolled(log, h.base_lsn);
    dkv__seg_retire(log);
    if (rc)
        return fail_at(log, what, file, rc);
    return 0;
}

/* The next segment after the loaded ones (or segment 0 of a new log). */
int dkv__create_next_segment(dkv_log *log)
{
    if (!log->nsegs)
        return create_segment(log, 0, 0);
    return create_segment(log, log->start_lsn, active(log)->digest);
}

/* Compute the crcs of the deferred frames in pend (mu held). */
static void crc_flush(dkv_log *log)
{
    unsigned n = log->ndefer;
    if (!n)
        return;
    log->ndefer = 0;
    if (n == 1) {
        uint8_t *f = log->pend + log->defer[0];
        put32(f, dkv_crc32c(log->seed, f + 4, (size_t)FRAME_HDR - 4 + get32(f + 4)));
        return;
    }
    uint32_t seeds[3], out[3];
    const uint8_t *p[3];
    size_t l[3];
    for (unsigned i = 0; i < 3; i++) {
        const uint8_t *f = log->pend + log->defer[i < n ? i : n - 1];
        seeds[i] = log->seed;
        p[i] = f + 4;
        l[i] = (size_t)FRAME_HDR - 4 + get32(f + 4);
    }
    dkv__crc32c_x3(seeds, p, l, out);
    for (unsigned i = 0; i < n; i++)
        put32(log->pend + log->defer[i], out[i]);
}

/* Encode one frame into pend (mu held). Rolls first if the frame does not fit. defer: the
 * frame's crc may wait for crc_flush (which runs before pend leaves the caller's hands). */
static int enqueue(dkv_log *log, uint8_t type, const uint8_t *buf, uint32_t len, int defer)
{
    size_t fs = (size_t)FRAME_HDR + len;
    seg_t *a = active(log);
    if (a->count > 0 && a->data_end + fs > log->opt.segment_bytes) {
        crc_flush(log);
        int rc = roll(log, 0);
        if (rc)
            return rc;
        a = active(log);
    }
    if (DKV_RESERVE(log->pend, log->pend_cap, log->pend_len + fs, 65536))
        return DKV_ENOMEM;
    if (dkv__index_push(a, a->data_end))
        return DKV_ENOMEM;
    uint8_t *f = log->pend + log->pend_len;
    /* durable_lsn only grows and the bytes are written after this: the recorded watermark
     * never overstates what was synced before the frame reached write(2). The leader
     * raises it to the watermark at write time (dkv__frames_restamp). */
    if (defer) {
        dkv__frame_fields(f, log->next_lsn, type, len, log->durable_lsn);
        memcpy(f + FRAME_HDR, buf, len);
        log->defer[log->ndefer++] = log->pend_len;
        if (log->ndefer == 3)
            crc_flush(log);
    } else {
        dkv__frame_header(f, log->seed, log->next_lsn, type, buf, len, log->durable_lsn);
        memcpy(f + FRAME_HDR, buf, len);
    }
    log->pend_len += fs;
    a->data_end += fs;
    a->count++;
    STORE_LSN(log->next_lsn, log->next_lsn + 1);
    return 0;
}

/* ---- several writers: the write section (FORMAT.md §12) ---- */

static int holds_section(dkv_log *log)
{
    return log->wheld && pthread_equal(log->wowner, pthread_self());
}

/* mu held (released while waiting for WLOCK). Shared writers only. */
static int write_enter(dkv_log *log)
{
    if (holds_section(log)) {
        log->wdepth++;
        return 0;
    }
    while (log->wheld && !log->failed && !log->closed)
        pthread_cond_wait(&log->cv, &log->mu);
    int rc = dkv__usable(log, 1);
    if (rc)
        return rc;
    log->wheld = 1;
    log->wdepth = 1;
    log->wowner = pthread_self();
    if (log->lease) {
        /* WLOCK held since this process's last section: no one else wrote; no catch-up */
        log->lease = 0;
        return 0;
    }
    pthread_mutex_unlock(&log->mu);
    rc = dkv__wlock_take(log);
    pthread_mutex_lock(&log->mu);
    if (!rc)
        rc = dkv__usable(log, 1);
    if (!rc)
        rc = dkv__catch_up(log);
    if (rc) {
        flock(log->wlock_fd, LOCK_UN);
        log->wheld = 0;
        pthread_cond_broadcast(&log->cv);
    }
    return rc;
}

/* Write pend under mu while a leader fsyncs the frames before it (its write is done, so
 * file order stays LSN order). mu held. */
static int write_pending(dkv_log *log)
{
    dkv__frames_restamp(log->pend, log->pend_len, log->seed, log->durable_lsn);
    int rc = dkv__pwrite_all(log->wfd, log->pend, log->pend_len, log->pend_off);
    if (!rc)
        rc = zero_ahead(log, log->wfd, log->pend_off + log->pend_len);
    if (rc)
        return fail(log, "write", rc);
    log->run_digest = digest_frames(log, log->run_digest, log->seed, log->pend, log->pend_len);
    log->pend_off += log->pend_len;
    log->pend_len = 0;
    log->written_lsn = log->next_lsn;
    pthread_cond_broadcast(&log->cv);
    /* async frames among them are owed an fdatasync the running leader's does not cover
     * (its cover was taken before this write); when that leader only waits for another
     * process's fsync (sync_step), no lead() ends to wake the flusher for them */
    wake_flusher(log);
    return 0;
}

/* mu held: write what the section appended (no fsync), then release WLOCK. */
static int write_exit(dkv_log *log)
{
    if (--log->wdepth > 0)
        return 0;
    int rc = 0;
    /* done when nothing is pending and no leader is still writing (one that syncs has
     * written its frames: the section's own go after them, without waiting for the fsync) */
    while (!log->failed && !log->closed
           && (log->pend_len || (log->leader && !log->lead_sync) || log->rolling)) {
        if (log->pend_len && log->leader && log->lead_sync && !log->rolling) {
            if ((rc = write_pending(log)))
                break;
            continue;
        }
        if (!log->leader && !log->rolling) {
            if ((rc = lead(log, 0)))
                break;
            continue;
        }
        pthread_cond_wait(&log->cv, &log->mu);
    }
    if (!rc && log->failed)
        rc = dkv__usable(log, 1);
    if (!rc)
        dkv__shm_written(log);
    log->wheld = 0;
    uint64_t now = dkv__mono_ns();
    if (!rc && !log->closed && !dkv__shm_wanted(log, now)) {
        /* no other process waits: keep WLOCK for this process's next section (FORMAT.md
         * §12, the lease); the flusher lets it go after LEASE_IDLE_NS without one */
        log->lease = 1;
        log->lease_ns = now;
        /* the flusher times the lease from now: wake it if it waits for work alone (it
         * looked while no lease was held -- e.g. while this section, which reused the
         * last one's lease, held WLOCK -- and would otherwise keep it forever, making
         * every other writer time out); in its timed wait it looks within LEASE_IDLE_NS */
        if (log->flusher_idle == FLUSHER_WAITS_FOR_WORK)
            pthread_cond_signal(&log->flush_cv);
    } else {
        /* a failed handle's unwritten frames were never acknowledged: releasing is safe */
        flock(log->wlock_fd, LOCK_UN);
    }
    pthread_cond_broadcast(&log->cv);
    return rc;
}

int dkv__write_section(dkv_log *log, int enter)
{
    return enter ? write_enter(log) : write_exit(log);
}

int dkv_write_begin(dkv_log *log)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = dkv__usable(log, 1);
    if (!rc && log->shared)
        rc = write_enter(log);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* The try calls' lock: mu, unless another thread keeps it longer than a short spin.
 * Threads hold mu through disk work at times (a roll's or a seal's fdatasyncs, a
 * catch-up's reads, write_pending's write): with the GIL held, waiting behind that would
 * stop every Python thread, so the caller makes the blocking call instead. 0: mu is held. */
static int try_lock(dkv_log *log)
{
    uint64_t until = 0;
    for (unsigned i = 0;; i++) {
        if (pthread_mutex_trylock(&log->mu) == 0)
            return 0;
        if (i % 16 == 0) {
            uint64_t now = dkv__mono_ns();
            if (!until)
                until = now + TRY_LOCK_NS;
            else if (now >= until)
                return DKV_WOULD_WAIT;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
}

/* mu held: appending a frame of `frame_bytes` (header included; 0: no frame) or ending a
 * section now could wait for disk work the blocking call is for: a roll (another
 * thread's, or this frame's own when it does not fit in the active segment: fdatasyncs, a
 * directory fsync) or another leader's write (an `exit` spill writes up to 32 MiB) */
static int would_block(dkv_log *log, size_t frame_bytes)
{
    if (log->closed)
        return 1;               /* the blocking call says so */
    const seg_t *a = active(log);
    return log->rolling || (log->leader && !log->lead_sync)
        || (frame_bytes && a->count > 0 && a->data_end + frame_bytes > log->opt.segment_bytes);
}

int dkv_write_begin_try(dkv_log *log)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (try_lock(log))
        return DKV_WOULD_WAIT;
    int rc = dkv__usable(log, 1);
    if (!rc && log->shared) {
        /* write_enter's cases that never wait: a nested section, or a free section under
         * this process's lease (WLOCK kept, nothing to catch up with). Waiting for another
         * thread's section, for WLOCK or reading other processes' frames is the blocking
         * call's: the other section's thread may need the caller's GIL to end it. */
        if (holds_section(log) || (!log->wheld && log->lease))
            rc = write_enter(log);
        else
            rc = DKV_WOULD_WAIT;
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* End the calling thread's section (mu held). owe_flush: when this is the outermost end,
 * every frame appended so far owes the flusher an fdatasync (an async commit's promise):
 * flush_want is raised before the write, as an async append raises it, so the flusher
 * syncs them once written whoever writes them. Returns 1 when owe_flush was asked and
 * nothing was written (a nested section, or a handle that shares no write lock). */
static int write_end_locked(dkv_log *log, int owe_flush)
{
    if (log->shared && !holds_section(log)) {
        dkv__set_error(log, "dkv_write_end without dkv_write_begin in this thread");
        return DKV_EINVAL;
    }
    if (!log->shared)
        return owe_flush;
    int outermost = log->wdepth == 1;
    if (owe_flush && outermost && log->next_lsn > log->flush_want)
        log->flush_want = log->next_lsn;
    int rc = write_exit(log);
    if (rc || !owe_flush)
        return rc;
    if (!outermost)
        return 1;       /* the outermost section's end writes them */
    wake_flusher(log);
    return 0;
}

static int write_end_call(dkv_log *log, int owe_flush)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = write_end_locked(log, owe_flush);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int dkv_write_end(dkv_log *log) { return write_end_call(log, 0); }
int dkv_write_end_async(dkv_log *log) { return write_end_call(log, 1); }

int dkv_write_end_try(dkv_log *log, int owe_flush)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (try_lock(log))
        return DKV_WOULD_WAIT;
    int rc = log->pend_len >= TRY_MAX_BYTES || would_block(log, 0) ? DKV_WOULD_WAIT
             : write_end_locked(log, owe_flush);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

static int append_locked(dkv_log *log, uint8_t type, const uint8_t *const *bufs,
                         const uint32_t *lens, uint32_t n, int durability, uint64_t *first)
{
    int rc = dkv__usable(log, 1);
    if (rc)
        return rc;
    if (type != DKV_FRAME_DATA && type != DKV_FRAME_COMMIT) {
        dkv__set_error(log, "unknown frame type %u", type);
        return DKV_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++)
        if (lens[i] > MAX_FRAME_LEN) {
            dkv__set_error(log, "frame of %u bytes is larger than the 1 GiB limit", lens[i]);
            return DKV_ETOOBIG;
        }
    if (durability < 0)
        durability = log->opt.durability;
    /* Back-pressure: bound what piles up behind a running leader; and no enqueue while
     * another thread rolls the segment. */
    size_t group_cap = durability == DKV_EXIT ? EXIT_HARD : GROUP_CAP;
    while (((log->leader && log->pend_len >= group_cap) || log->rolling) && !log->failed
           && !log->closed)
        pthread_cond_wait(&log->cv, &log->mu);
    if ((rc = dkv__usable(log, 1)))
        return rc;
    /* another process may append: LSNs are taken under WLOCK, after catching up */
    int implicit = log->shared && !holds_section(log);
    if (implicit && (rc = write_enter(log)))
        return rc;
    *first = log->next_lsn;
    log->appending++;       /* a roll may let mu go: dkv_close waits for the whole batch */
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = enqueue(log, type, bufs[i], lens[i], n > 1);
    if (!--log->appending && log->shut)
        pthread_cond_broadcast(&log->cv);
    crc_flush(log);
    uint64_t end = log->next_lsn;
    if (!rc && durability == DKV_ASYNC && end > log->flush_want)
        log->flush_want = end;
    if (implicit) {
        int rc2 = write_exit(log);
        rc = rc ? rc : rc2;
        wake_flusher(log);      /* the section wrote them before flush_want was looked at */
    }
    if (rc)
        return rc;
    for (;;) {
        if (log->failed)
            return dkv__usable(log, 1);
        if (durability == DKV_SYNC ? log->durable_lsn >= end
            : durability == DKV_ASYNC ? log->written_lsn >= end
            : log->pend_len < EXIT_SPILL || log->leader)
            return 0;
        if (log->closed)    /* after the goal: close's flush met it for every frame before */
            return dkv__usable(log, 1);
        if (durability == DKV_EXIT && log->pend_len < EXIT_HARD && log->flusher_running) {
            /* Spill in the background: the flusher writes pend (no fsync; the buffer swap
             * is O(1)), so exit appends never wait for a 4 MiB write. */
            if (!log->spill_req) {
                log->spill_req = 1;
                pthread_cond_signal(&log->flush_cv);
            }
            return 0;
        }
        if (!log->leader && !log->rolling) {
            rc = durability == DKV_SYNC ? sync_step(log, end) : lead(log, 0);
            if (rc)
                return rc;
            continue;
        }
        if (log->pend_len && log->leader && log->lead_sync && !log->rolling &&
            (!log->shared || holds_section(log))) {
            /* a leader's fdatasync runs and its frames are written: these follow now, as
             * write_exit writes them, not after the fsync. A caller in a section (the
             * store holds its lock around one) would keep every other thread waiting for
             * the disk. */
            if ((rc = write_pending(log)))
                return rc;
            continue;
        }
        pthread_cond_wait(&log->cv, &log->mu);
    }
}

int dkv_append(dkv_log *log, uint8_t type, const uint8_t *buf, uint32_t len, int durability,
               uint64_t *lsn_out)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = append_locked(log, type, &buf, &len, 1, durability, lsn_out);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int64_t dkv_append_lsn(dkv_log *log, uint8_t type, const char *buf, uint32_t len, int durability)
{
    DKV_OWNED(log, DKV_EFORKED);
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t lsn = 0;
    pthread_mutex_lock(&log->mu);
    int rc = append_locked(log, type, &b, &len, 1, durability, &lsn);
    pthread_mutex_unlock(&log->mu);
    return rc ? rc : (int64_t)lsn;
}

int64_t dkv_append_try(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                       int durability)
{
    DKV_OWNED(log, DKV_EFORKED);
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t lsn = 0;
    if (try_lock(log))
        return DKV_WOULD_WAIT;
    if (durability < 0)
        durability = log->opt.durability;
    /* a sync append waits for an fdatasync; one outside a section may wait for another
     * thread's section: the blocking call's, as dkv_write_begin_try's cases are */
    int rc = durability == DKV_SYNC || (log->shared && !holds_section(log))
             || len >= TRY_MAX_BYTES || log->pend_len >= TRY_MAX_BYTES
             || would_block(log, (size_t)FRAME_HDR + len) ? DKV_WOULD_WAIT
             : append_locked(log, type, &b, &len, 1, durability, &lsn);
    pthread_mutex_unlock(&log->mu);
    return rc ? rc : (int64_t)lsn;
}

/* dkv_append_one's work, mu held. try_only: refuse with DKV_WOULD_WAIT, nothing done,
 * whatever dkv_write_begin_try or dkv_append_try would refuse. */
static int64_t append_one_locked(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                                 int durability, uint64_t expect, int try_only)
{
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t lsn = 0;
    int rc = dkv__usable(log, 1);
    if (rc)
        return rc;
    if (try_only) {
        int d = durability < 0 ? log->opt.durability : durability;
        if (d == DKV_SYNC || len >= TRY_MAX_BYTES || log->pend_len >= TRY_MAX_BYTES
                || would_block(log, (size_t)FRAME_HDR + len)
                || (log->shared && !holds_section(log) && (log->wheld || !log->lease)))
            return DKV_WOULD_WAIT;
    }
    /* dkv_write_begin's part: the section (WLOCK, and the catch-up if the lease lapsed) */
    if (log->shared && (rc = write_enter(log)))
        return rc;
    /* the caller's view of the log is behind (another process appended): it takes those
     * frames in before its own, so append nothing and end the section */
    int moved = log->next_lsn != expect;
    if (!moved)
        rc = append_locked(log, type, &b, &len, 1, durability, &lsn);
    /* dkv_write_end's part, also after a failed append (the section is released, as the
     * caller's write_end would release it) */
    int rc2 = log->shared ? write_end_locked(log, 0) : 0;
    if (rc || rc2)
        return rc ? rc : rc2;
    return moved ? DKV_MOVED : (int64_t)lsn;
}

static int64_t append_one_call(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                               int durability, uint64_t expect, int try_only)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (!try_only)
        pthread_mutex_lock(&log->mu);
    else if (try_lock(log))
        return DKV_WOULD_WAIT;
    int64_t r = append_one_locked(log, type, buf, len, durability, expect, try_only);
    pthread_mutex_unlock(&log->mu);
    return r;
}

int64_t dkv_append_one(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                       int durability, uint64_t expect)
{
    return append_one_call(log, type, buf, len, durability, expect, 0);
}

int64_t dkv_append_one_try(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                           int durability, uint64_t expect)
{
    return append_one_call(log, type, buf, len, durability, expect, 1);
}

int dkv_append_packed(dkv_log *log, uint8_t type, const char *data, const uint32_t *lens,
                      uint32_t n, int durability, uint64_t *first_lsn_out)
{
    DKV_OWNED(log, DKV_EFORKED);
    const uint8_t *one[64];
    const uint8_t **bufs = n <= 64 ? one : malloc((size_t)n * sizeof *bufs);
    if (!bufs)
        return DKV_ENOMEM;
    const uint8_t *p = (const uint8_t *)data;
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = p;
        p += lens[i];
    }
    pthread_mutex_lock(&log->mu);
    int rc = append_locked(log, type, bufs, lens, n, durability, first_lsn_out);
    pthread_mutex_unlock(&log->mu);
    if (bufs != one)
        free(bufs);
    return rc;
}

static int wait_durable_locked(dkv_log *log, uint64_t end)
{
    for (;;) {
        int rc = dkv__usable(log, 0);
        if (rc)
            return rc;
        if (log->opt.read_only || log->durable_lsn >= end)
            return 0;
        if (!log->leader && !log->rolling) {
            if ((rc = sync_step(log, end)))
                return rc;
            continue;
        }
        pthread_cond_wait(&log->cv, &log->mu);
    }
}

int dkv_wait_written(dkv_log *log, uint64_t lsn)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = 0;
    if (lsn >= log->next_lsn) {
        dkv__set_error(log, "lsn %llu has not been appended (next lsn %llu)",
                       (unsigned long long)lsn, (unsigned long long)log->next_lsn);
        rc = DKV_ENOLSN;
    }
    /* the flusher owes these frames an fdatasync, as it does an async append's (a frame
     * queued under DKV_EXIT is otherwise never synced before close or flush) */
    if (!rc && lsn + 1 > log->flush_want)
        log->flush_want = lsn + 1;
    while (!rc && !log->opt.read_only && log->written_lsn <= lsn) {
        if ((rc = dkv__usable(log, 0)))
            break;
        if (!log->leader && !log->rolling)
            rc = lead(log, 0);
        else
            pthread_cond_wait(&log->cv, &log->mu);
    }
    if (!rc)
        wake_flusher(log);      /* another leader may have written them before the raise */
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int dkv_flush(dkv_log *log)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = wait_durable_locked(log, log->next_lsn);
    pthread_mutex_unlock(&log->mu);
    return rc;
}

int dkv_wait_durable(dkv_log *log, uint64_t lsn)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc;
    if (lsn >= log->next_lsn) {
        dkv__set_error(log, "lsn %llu has not been appended (next lsn %llu)",
                       (unsigned long long)lsn, (unsigned long long)log->next_lsn);
        rc = DKV_ENOLSN;
    } else {
        rc = wait_durable_locked(log, lsn + 1);
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* The async flusher: fdatasync within flush_interval_ms of the first unsynced write. It
 * syncs concurrently with leaders' writes; `syncing` keeps a roll from closing the fd. */
void *dkv__flusher_main(void *arg)
{
    dkv_log *log = arg;
    pthread_mutex_lock(&log->mu);
    while (!log->stop) {
        if (log->spill_req && !log->failed) {
            /* exit policy: write what appenders buffered (GUARANTEES.md: exit promises no fsync) */
            if (log->leader || log->rolling) {
                pthread_cond_wait(&log->cv, &log->mu);
                continue;
            }
            log->spill_req = 0;
            lead(log, 0);           /* a failure fails the handle; appenders see it */
            continue;
        }
        lease_tick(log);
        if (log->failed || !flush_due(log)) {
            log->flusher_idle = log->lease ? FLUSHER_TIMES_LEASE : FLUSHER_WAITS_FOR_WORK;
            if (log->lease) {       /* look at the lease again within a millisecond */
                struct timespec t = realtime_in(LEASE_IDLE_NS);
                pthread_cond_timedwait(&log->flush_cv, &log->mu, &t);
            } else {
                pthread_cond_wait(&log->flush_cv, &log->mu);
            }
            log->flusher_idle = 0;
            continue;
        }
        uint64_t due = dkv__mono_ns() + (uint64_t)log->opt.flush_interval_ms * 1000000u;
        for (;;) {
            uint64_t now = dkv__mono_ns();
            if (log->stop || now >= due)
                break;
            uint64_t step = due - now;
            if (log->lease && step > LEASE_IDLE_NS)
                step = LEASE_IDLE_NS;
            struct timespec t = realtime_in(step);
            pthread_cond_timedwait(&log->flush_cv, &log->mu, &t);
            lease_tick(log);
            if (log->spill_req && !log->failed && !log->leader && !log->rolling) {
                log->spill_req = 0;
                lead(log, 0);
            }
        }
        while (log->rolling && !log->stop)
            pthread_cond_wait(&log->cv, &log->mu);
        if (log->stop || log->failed || !flush_due(log))
            continue;
        log->syncing = 1;
        uint64_t upto = log->written_lsn, base = active(log)->base_lsn;
        int fd = log->wfd;
        pthread_mutex_unlock(&log->mu);
        uint64_t cover = dkv__shm_cover(log, base, upto);   /* other processes' frames too */
        int rc = dkv__fdatasync(fd);
        dkv__shm_synced(log, cover, !rc, 0);
        pthread_mutex_lock(&log->mu);
        log->syncing = 0;
        if (rc)
            fail(log, "fdatasync", rc);
        else
            __atomic_add_fetch(&log->flusher_syncs, 1, __ATOMIC_RELAXED);
        if (!rc)
            raise_durable(log, cover);
        pthread_cond_broadcast(&log->cv);
    }
    pthread_mutex_unlock(&log->mu);
    return NULL;
}

uint64_t dkv_durable_lsn(dkv_log *log) { return __atomic_load_n(&log->durable_lsn, __ATOMIC_RELAXED); }
uint64_t dkv_next_lsn(dkv_log *log) { return __atomic_load_n(&log->next_lsn, __ATOMIC_RELAXED); }
const uint64_t *dkv_next_lsn_at(dkv_log *log) { return &log->next_lsn; }
uint64_t dkv_start_lsn(dkv_log *log) { return __atomic_load_n(&log->start_lsn, __ATOMIC_RELAXED); }

int dkv_seal(dkv_log *log, uint64_t new_start_lsn)
{
    DKV_OWNED(log, DKV_EFORKED);
    pthread_mutex_lock(&log->mu);
    int rc = dkv__usable(log, 1);
    int implicit = !rc && log->shared && !holds_section(log);
    if (implicit && (rc = write_enter(log)))
        implicit = 0;
    if (!rc && new_start_lsn && (new_start_lsn < log->start_lsn || new_start_lsn > log->next_lsn)) {
        dkv__set_error(log, "new start lsn %llu outside %llu..%llu",
                       (unsigned long long)new_start_lsn, (unsigned long long)log->start_lsn,
                       (unsigned long long)log->next_lsn);
        rc = DKV_EINVAL;
    }
    if (!rc && active(log)->count > 0)
        rc = roll(log, new_start_lsn);
    else if (!rc && new_start_lsn && new_start_lsn != log->start_lsn) {
        /* Empty active segment: rewrite its header in place with the new start. The file
         * stays (HEAD names it, FORMAT.md §2a); a torn rewrite is a torn segment header. */
        dkv__quiesce(log);
        seg_t *a = active(log);
        seg_header h;
        memcpy(h.uuid, log->uuid, 16);
        h.segment_no = a->segment_no;
        h.base_lsn = a->base_lsn;
        h.start_lsn = new_start_lsn;
        h.prev_digest = a->prev_digest;
        h.flags = a->flags;     /* the segment keeps what it said it may hold */
        uint8_t hb[HDR_LEN];
        dkv__header_encode(&h, hb);
        const char *what = "write";
        rc = dkv__pwrite_all(log->wfd, hb, HDR_LEN, 0);
        if (!rc) {
            what = "fdatasync";
            rc = dkv__fdatasync(log->wfd);
        }
        if (rc) {
            rc = fail(log, what, rc);
        } else {
            a->start_lsn = new_start_lsn;
            log->run_digest = dkv_crc32c(log->seed, hb, HDR_LEN);
            STORE_LSN(log->start_lsn, new_start_lsn);
        }
    }
    if (!rc && new_start_lsn) {
        int removed = 0;
        for (size_t i = 0; i + 1 < log->nsegs; i++) {
            seg_t *s = &log->segs[i];
            if (s->removed || !s->sealed || s->base_lsn + s->count > new_start_lsn)
                continue;
            char path[DKV_PATH_MAX];
            if ((dkv__seg_path(path, log->dir, s->base_lsn) || unlink(path)) && errno != ENOENT) {
                char name[64];
                dkv__seg_name(name, s->base_lsn);
                rc = fail_at(log, "unlink", name, -errno);
                break;
            }
            s->removed = 1;
            removed = 1;
        }
        if (!rc && removed && (rc = dkv__dirfsync(log->dir)))
            rc = fail_at(log, "directory fsync", "", rc);
    }
    if (implicit) {
        int rc2 = write_exit(log);
        rc = rc ? rc : rc2;
    }
    pthread_mutex_unlock(&log->mu);
    return rc;
}

/* Close this process's descriptors of the handle and forget them (-1): its segments',
 * the grave's and LOCK's and WLOCK's (which releases their flocks). */
static void close_fds(dkv_log *log)
{
    for (size_t i = 0; i < log->nsegs; i++)
        if (log->segs[i].fd >= 0) {
            close(log->segs[i].fd);
            log->segs[i].fd = -1;
        }
    log->wfd = -1;
    dkv__fd_close_grave(log);
    if (log->lock_fd >= 0)
        close(log->lock_fd);
    log->lock_fd = -1;
    if (log->wlock_fd >= 0)
        close(log->wlock_fd);
    log->wlock_fd = -1;
}

/* dkv_close of an inherited handle: close this process's copies of its descriptors (the
 * parent's stay open, and so does its flock, held through the parent's LOCK fd) and leave
 * the rest: no lock (mu may be held by a thread this process lacks), no write, no fsync,
 * no join (the flusher thread is the parent's). The memory stays as the fork copied it. */
static int close_inherited(dkv_log *log)
{
    close_fds(log);
    log->nsegs = 0;
    return 0;
}

/* Wait until no other thread is in a call on the handle (closed is set: each one returns
 * DKV_ECLOSED, or what it was about to; a waiting one is woken by the broadcast). The calls
 * wait for no one long: a WLOCK or LOCK poll sees closed within a millisecond, a wait for
 * another process's fdatasync lasts 10 ms at most, a pread ends. */
static void drain_calls(dkv_log *log)
{
    while (__atomic_load_n(&log->calls, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&log->mu);
        pthread_cond_broadcast(&log->cv);
        pthread_mutex_unlock(&log->mu);
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
    }
}

int dkv_close(dkv_log *log)
{
    if (!log)
        return 0;
    if (dkv__inherited(log))
        return close_inherited(log);
    pthread_mutex_lock(&log->mu);
    if (log->shut) {
        pthread_mutex_unlock(&log->mu);
        return 0;
    }
    log->shut = 1;          /* no append begins from here (dkv__usable) */
    /* a handle that failed before (a background fdatasync no call saw) says so again:
     * its message and errno, not whatever a later call left in err */
    int rc = log->failed ? failed_error(log) : 0;
    /* flush until every frame is durable, the rest of appends already under way included
     * (a batch that rolls lets mu go between its frames) */
    while (!rc && !log->closed && !log->broken && !log->opt.read_only) {
        while (log->appending || log->leader || log->syncing || log->rolling)
            pthread_cond_wait(&log->cv, &log->mu);
        if (log->failed)
            rc = failed_error(log);
        else if (log->durable_lsn >= log->next_lsn)
            break;
        else
            rc = wait_durable_locked(log, log->next_lsn);
    }
    dkv__quiesce(log);
    log->stop = 1;
    /* from here every call returns DKV_ECLOSED; every frame is durable (or the handle
     * failed, and none past the failure was acknowledged) */
    __atomic_store_n(&log->closed, 1, __ATOMIC_SEQ_CST);    /* before drain_calls' loads */
    pthread_cond_broadcast(&log->cv);
    pthread_cond_broadcast(&log->flush_cv);
    pthread_mutex_unlock(&log->mu);
    if (log->flusher_running)
        pthread_join(log->flusher, NULL);
    log->flusher_running = 0;
    drain_calls(log);
    pthread_mutex_lock(&log->mu);
    close_fds(log);
    dkv__shm_close(log);
    for (size_t i = 0; i < log->nsegs; i++) {   /* a read finds the handle closed first */
        free(log->segs[i].index);
        log->segs[i].index = NULL;
        log->segs[i].n_index = log->segs[i].cap_index = 0;
        log->segs[i].index_loaded = 0;
    }
    free(log->pend);
    free(log->spare);
    log->pend = log->spare = NULL;
    log->pend_len = log->pend_cap = log->spare_cap = 0;
    pthread_mutex_unlock(&log->mu);
    return rc;
}

void dkv_destroy(dkv_log *log)
{
    if (!log || dkv__inherited(log))
        return;                 /* an inherited handle's memory stays (close_inherited) */
    dkv_close(log);
    free(log->grave);
    pthread_mutex_destroy(&log->mu);
    pthread_cond_destroy(&log->cv);
    pthread_cond_destroy(&log->flush_cv);
    free(log->segs);
    free(log->dir);
    free(log);
}

/* How many fdatasyncs group-commit leaders ran on this handle (frames / syncs = the
 * group size: a test and benchmark counter). */
uint64_t dkv_commit_syncs(dkv_log *log)
{
    DKV_OWNED(log, 0);
    pthread_mutex_lock(&log->mu);
    uint64_t n = log->commit_syncs;
    pthread_mutex_unlock(&log->mu);
    return n;
}

uint32_t dkv_active_flags(dkv_log *log)
{
    DKV_OWNED(log, 0);
    pthread_mutex_lock(&log->mu);
    uint32_t f = log->nsegs ? active(log)->flags : 0;
    pthread_mutex_unlock(&log->mu);
    return f;
}

/* Read without mu, as the LSNs are: a test or benchmark polls it while commits run. */
uint64_t dkv_flusher_syncs(dkv_log *log)
{
    DKV_OWNED(log, 0);
    return __atomic_load_n(&log->flusher_syncs, __ATOMIC_RELAXED);
}
