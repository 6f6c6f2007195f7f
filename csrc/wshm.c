/* WSHM: the state several writer processes of one store share through a small mmap'd file
 * (docs/FORMAT.md §12): where the written frames end, what some process's fdatasync
 * covered (cross-process group commit), a failed fdatasync, and who waits for WLOCK (the
 * lease). Derived state only: rebuilt at open, never needed to read the log.
 *
 * Every field is read and written with atomics; seg_base/written change only under WLOCK,
 * behind a seqlock, so a syncer (no lock) reads a pair that belongs together. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "log_int.h"

static const char WSHM_MAGIC[8] = "DKVWSHM1";

_Static_assert(sizeof(dkv_wshm) == WSHM_LEN, "WSHM layout is FORMAT.md §12");

#define LD(f) __atomic_load_n(&(f), __ATOMIC_ACQUIRE)
#define ST(f, v) __atomic_store_n(&(f), (v), __ATOMIC_RELEASE)

uint64_t dkv__mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Raise *f to v (never lower it). */
static void raise_to(uint64_t *f, uint64_t v)
{
    uint64_t cur = LD(*f);
    while (cur < v && !__atomic_compare_exchange_n(f, &cur, v, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
}

/* The state of a log just loaded by a writer that owns it: nothing shared yet. */
static void rebuild(dkv_log *log, dkv_wshm *m)
{
    const seg_t *a = &log->segs[log->nsegs - 1];
    /* Counters and holder_pid are kept from a valid file (seq made even: no update is
     * in progress when a writer is alone), so that reopening an unchanged log rewrites
     * WSHM byte for byte (an open that changes nothing in the log changes no file) */
    int valid = !memcmp(m->magic, WSHM_MAGIC, 8);
    uint32_t holder = valid ? LD(m->holder_pid) : 0;
    uint32_t seq = valid ? (LD(m->seq) + 1) & ~1u : 0;
    uint32_t wake = valid ? LD(m->wake) : 0;
    memset(m, 0, WSHM_LEN);
    m->holder_pid = holder;
    m->seq = seq;
    m->wake = wake;
    memcpy(m->uuid, log->uuid, 16);
    m->epoch = log->epoch;
    m->seg_base = a->base_lsn;
    m->written = log->next_lsn;
    m->durable = log->next_lsn;     /* open made the active segment durable (FORMAT.md §3) */
    m->syncing = log->next_lsn;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(m->magic, WSHM_MAGIC, 8);
}

int dkv__shm_map(dkv_log *log)
{
    char p[DKV_PATH_MAX];
    int fd = dkv__path(p, log->dir, "WSHM") ? -1 : open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return dkv__io_error(log, errno, "cannot open %s", p);
    struct stat st;
    int short_file = !fstat(fd, &st) && st.st_size < WSHM_LEN;
    if (short_file && ftruncate(fd, WSHM_LEN)) {
        int e = errno;
        close(fd);
        return dkv__io_error(log, e, "cannot size %s", p);
    }
    /* A block for the mapping before it is touched: a store through its first open on a
     * full disk had the first store to the hole (or to a file an older version sized)
     * kill the process with SIGBUS instead of failing the open with ENOSPC. The kernel's
     * fallocate never changes data (glibc's emulation would, racing other writers), and
     * a file system without it keeps the old behaviour. */
    if (fallocate(fd, 0, 0, WSHM_LEN) && errno != EOPNOTSUPP && errno != ENOSYS) {
        int e = errno;
        close(fd);
        return dkv__io_error(log, e, "cannot allocate %s", p);
    }
    void *m = mmap(NULL, WSHM_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);      /* the mapping keeps the file */
    if (m == MAP_FAILED)
        return dkv__io_error(log, e, "cannot map %s", p);
    dkv_wshm *w = m;
    if (short_file)
        memset(w->magic, 0, 8);     /* never valid: rebuilt by dkv__shm_check */
    log->shm = w;
    return 0;
}

void dkv__shm_check(dkv_log *log, int alone)
{
    dkv_wshm *w = log->shm;
    /* alone: whatever the file says (a crash's, a power loss's) is not this log's now */
    if (alone || memcmp(w->magic, WSHM_MAGIC, 8) || memcmp(w->uuid, log->uuid, 16) ||
        w->epoch != log->epoch)
        rebuild(log, w);
}

void dkv__shm_close(dkv_log *log)
{
    if (log->shm)
        munmap(log->shm, WSHM_LEN);
    log->shm = NULL;
}

void dkv__shm_written(dkv_log *log)
{
    dkv_wshm *m = log->shm;
    if (!m)
        return;
    uint32_t s = m->seq;            /* only WLOCK's holder writes seq */
    ST(m->seq, s + 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    ST(m->seg_base, log->segs[log->nsegs - 1].base_lsn);
    ST(m->written, log->written_lsn);
    ST(m->seq, s + 2);
}

void dkv__shm_rolled(dkv_log *log, uint64_t new_base)
{
    if (log->shm)
        raise_to(&log->shm->durable, new_base);     /* the seal fdatasync'd every older frame */
}

uint64_t dkv__shm_cover(dkv_log *log, uint64_t base, uint64_t own)
{
    dkv_wshm *m = log->shm;
    if (!m)
        return own;
    uint64_t w;
    for (;;) {
        uint32_t s1 = LD(m->seq);
        uint64_t b = LD(m->seg_base);
        w = LD(m->written);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (!(s1 & 1) && LD(m->seq) == s1) {
            if (b != base)
                w = 0;      /* another segment's end: this fd does not hold those frames */
            break;
        }
    }
    uint64_t cover = w > own ? w : own;
    raise_to(&m->syncing, cover);
    return cover;
}

static void wake_all(dkv_wshm *m)
{
    __atomic_add_fetch(&m->wake, 1, __ATOMIC_ACQ_REL);
    if (LD(m->waiters))
        syscall(SYS_futex, &m->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void give_turn(dkv_log *log)
{
    uint32_t me = (uint32_t)log->pid;
    __atomic_compare_exchange_n(&log->shm->sync_owner, &me, 0, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

void dkv__shm_turn_release(dkv_log *log)
{
    if (!log->shm)
        return;
    give_turn(log);
    wake_all(log->shm);
}

void dkv__shm_synced(dkv_log *log, uint64_t cover, int ok, int turn)
{
    dkv_wshm *m = log->shm;
    if (!m)
        return;
    if (ok)
        raise_to(&m->durable, cover);
    else
        ST(m->poison, 1);
    if (turn)
        give_turn(log);
    wake_all(m);
}

int dkv__shm_poisoned(dkv_log *log) { return log->shm && LD(log->shm->poison); }

uint64_t dkv__shm_durable(dkv_log *log) { return log->shm ? LD(log->shm->durable) : 0; }

int dkv__shm_sync_turn(dkv_log *log)
{
    uint32_t none = 0;
    return !log->shm || __atomic_compare_exchange_n(&log->shm->sync_owner, &none,
                                                    (uint32_t)log->pid, 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_ACQUIRE);
}

#define TURN_STALL_NS 100000000u   /* 100 ms: a turn held this long with no publish is lost */

void dkv__shm_wait(dkv_log *log, uint64_t end, uint32_t timeout_us)
{
    dkv_wshm *m = log->shm;
    uint32_t v = LD(m->wake);
    uint32_t owner = LD(m->sync_owner);
    __atomic_add_fetch(&m->waiters, 1, __ATOMIC_ACQ_REL);
    long r = 0;
    if (owner && LD(m->durable) < end && !LD(m->poison)) {
        struct timespec t = {0, (long)timeout_us * 1000};
        r = syscall(SYS_futex, &m->wake, FUTEX_WAIT, v, &t, NULL, 0);
    }
    __atomic_sub_fetch(&m->waiters, 1, __ATOMIC_ACQ_REL);
    /* no publish for timeout_us: a syncer killed mid-fdatasync never gives its turn back */
    if (r && errno == ETIMEDOUT && owner && kill((pid_t)owner, 0) && errno == ESRCH) {
        __atomic_compare_exchange_n(&m->sync_owner, &owner, 0, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
        return;
    }
    /* nor for TURN_STALL_NS while this process waited: the holder is stopped (SIGSTOP),
     * stuck in a slow disk, or dead with its pid reused (or seen from another pid
     * namespace), which kill() cannot tell from alive. Its turn is taken (FORMAT.md §12):
     * the turn only spares duplicate fdatasyncs, and its late publish raises `durable`
     * only to what its own fdatasync covered. */
    owner = LD(m->sync_owner);
    uint32_t w = LD(m->wake);
    uint64_t now = dkv__mono_ns();
    if (owner != log->turn_owner || w != log->turn_wake) {
        log->turn_owner = owner;        /* another holder, or a publish: progress */
        log->turn_wake = w;
        log->turn_since = now;
    } else if (owner && now - log->turn_since >= TURN_STALL_NS) {
        __atomic_compare_exchange_n(&m->sync_owner, &owner, 0, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
        log->turn_owner = 0;
    }
}

void dkv__shm_want(dkv_log *log, uint64_t until_ns)
{
    if (log->shm)
        raise_to(&log->shm->want_ns, until_ns);
}

void dkv__shm_unwant(dkv_log *log)
{
    if (log->shm)
        ST(log->shm->want_ns, 0);
}

int dkv__shm_wanted(dkv_log *log, uint64_t now_ns)
{
    return !log->shm || LD(log->shm->want_ns) > now_ns;
}

int dkv__shm_holder_is(dkv_log *log, uint32_t pid)
{
    return log->shm && LD(log->shm->holder_pid) == pid;
}

void dkv__shm_set_holder(dkv_log *log, uint32_t pid)
{
    if (log->shm)
        ST(log->shm->holder_pid, pid);
}

int dkv_shared_durable(dkv_log *log, uint64_t *durable, uint64_t *publishes)
{
    DKV_OWNED(log, DKV_EFORKED);
    if (__atomic_load_n(&log->closed, __ATOMIC_SEQ_CST))
        return DKV_ECLOSED;
    if (!log->shm)
        return DKV_EINVAL;
    *durable = LD(log->shm->durable);
    *publishes = LD(log->shm->wake);
    return 0;
}
