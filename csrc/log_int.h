/* The log handle's private state, shared by seglog.c (writes, reads) and open.c (open,
 * recovery at open, refresh). Everything below `mu` is guarded by it. */
#ifndef DKV_LOG_INT_H
#define DKV_LOG_INT_H

#include <pthread.h>

#include "dkv_internal.h"

typedef struct {
    uint64_t base_lsn, segment_no, start_lsn;
    uint32_t prev_digest;
    uint32_t flags;         /* the header's (SEG_FLAG_*) */
    int sealed;
    int removed;            /* below start_lsn and unlinked */
    uint64_t count;         /* frames, incl. pending ones in the active segment */
    uint64_t data_end;      /* end of frames (active: incl. pending bytes) */
    uint64_t file_size;
    uint32_t digest;        /* sealed: segment_digest from the trailer */
    uint64_t *index;        /* frame offsets by lsn - base_lsn (0 = lost, salvage) */
    size_t n_index, cap_index;
    int index_loaded;       /* sealed segments load their index on first read */
    int fd;                 /* -1: closed (a sealed segment opens on demand, segfd.c) */
    int fd_cached;          /* fd is one of the handle's cached sealed-segment fds */
    uint64_t dev, ino;      /* the file this handle loaded: a reopen must find the same one */
} seg_t;

/* WSHM (wshm.c, FORMAT.md §12): what the writer processes of one store share. */
#define WSHM_LEN 128
typedef struct {
    char magic[8];
    uint8_t uuid[16];
    uint64_t epoch;
    uint32_t seq, wake;         /* seqlock over seg_base/written; futex word */
    uint64_t seg_base, written, durable, syncing, want_ns;
    uint32_t poison, waiters, holder_pid;
    uint32_t sync_owner;        /* pid running the store's fdatasync now, 0: none */
    uint8_t reserved[32];
} dkv_wshm;

/* Sealed segments whose fd stays open at a time (segfd.c); the active segment's is extra. */
#define SEALED_FDS 64

struct dkv_log {
    char *dir;
    dkv_options opt;
    int lock_fd;
    int wlock_fd;               /* WLOCK: the cross-process write lock (shared writers) */
    int shared;                 /* LOCK held shared: other processes may write (FORMAT.md §12) */
    int wheld, wdepth;          /* a thread of this process holds WLOCK (mu) */
    int lease;                  /* WLOCK kept between sections (no other process wants it) */
    uint64_t lease_ns;          /*   since the end of the last section (CLOCK_MONOTONIC) */
    dkv_wshm *shm;              /* WSHM mapped (shared writers), else NULL */
    uint32_t turn_owner;        /* dkv__shm_wait: the turn's holder seen, */
    uint32_t turn_wake;         /*   WSHM's wake then, */
    uint64_t turn_since;        /*   and since when (CLOCK_MONOTONIC ns) with no publish */
    pthread_t wowner;
    uint8_t uuid[16];
    seg_t *segs;
    size_t nsegs, cap_segs;
    uint64_t start_lsn;

    pthread_mutex_t mu;
    pthread_cond_t cv;          /* leader done, state changed */
    pthread_cond_t flush_cv;    /* wakes the async flusher */
    int wfd;                    /* active segment, writer only */
    uint32_t seed;              /* active segment's frame seed */
    uint32_t run_digest;        /* crc32c(seed, active bytes [0, written_off)) */
    uint64_t dg_len, dg_last;   /* digest_frames' cached operator is for frames of dg_len */
    uint32_t dg_op;             /*   (leader or roll only, like run_digest) */
    uint8_t *pend, *spare;      /* frames not yet written; spare = the leader's buffer */
    size_t pend_len, pend_cap, spare_cap;
    uint64_t pend_off;          /* file offset of pend[0] */
    uint64_t zero_end;          /* the active segment's bytes from the frames' end up to here
                                 * are zeros the writer wrote ahead (slack, FORMAT.md §3, §9):
                                 * a lower bound of the file's size (leader or roll only) */
    size_t defer[3];            /* pend offsets of frames whose crc is still to compute */
    unsigned ndefer;            /*   (batches: three at a time, interleaved); 0 outside mu */
    uint64_t next_lsn, written_lsn, durable_lsn;
    uint64_t commit_syncs;          /* fdatasyncs run by group-commit leaders (mu) */
    uint64_t flusher_syncs;         /* fdatasyncs run by the async flusher (atomic) */
    int leader, syncing, rolling;
    int appending;              /* appends enqueuing their frames (mu): dkv_close waits */
    int lead_sync;              /* the leader has written its group and runs its fsync */
    int failed;
    char failmsg[256];
    int closed;
    int broken;                 /* open failed: only close/last_error/last_damage work */
    int shut;                   /* dkv_close began: no frame is appended; a second one returns */
    int calls;                  /* public calls in progress (atomic): dkv_close waits for 0 */
    pthread_t flusher;
    int flusher_running, stop;
    uint64_t flush_want;        /* async appends up to here: the flusher syncs them (exit
                                 * spills alone are not synced: that policy promises nothing) */
    int flusher_idle;           /* flusher waits for work: a write must wake it; its kind: */
#define FLUSHER_WAITS_FOR_WORK 1    /* untimed: a new lease must wake it too */
#define FLUSHER_TIMES_LEASE 2       /* timed: it looks at the lease within LEASE_IDLE_NS */
    int spill_req;              /* exit policy: the flusher writes pend in the background */
    int has_damage;
    int cut;                    /* point_in_time cut the log at damage: refresh stays put */
    uint64_t epoch;             /* HEAD's repair epoch at open (0 without HEAD), FORMAT.md §2a */
    int repair;                 /* opened by recover: HEAD unchecked, a missing prefix allowed */
    dkv_damage damage;
    char err[1024];             /* dkv_last_error: what failed, then what helps */
    int err_errno;              /* errno behind err (0: none), dkv_last_errno */
    int fail_errno;             /* errno of the failure that failed the handle */
    /* Sealed segments' fds (segfd.c): the open ones, oldest first from fd_pos; fds evicted
     * while a reader may still pread them wait in grave until fd_readers drops to 0. */
    size_t fd_ring[SEALED_FDS];
    unsigned fd_n, fd_pos;
    int *grave;
    unsigned ngrave;
    size_t cap_grave;
    int fd_readers;             /* readers between locate and the end of their pread (atomic) */
    unsigned fork_gen;          /* dkv__fork_gen when opened: another value, another process */
    int pid;                    /* the process that opened it (for the fork error's message) */
};

/* ---- fork (seglog.c): a handle belongs to the process that opened it ---- */
/* Bumped in every child fork() makes (pthread_atfork): a handle whose fork_gen differs was
 * opened by an ancestor. One load and compare per call: no getpid. */
extern unsigned dkv__fork_gen;
/* Record the opening process in a new handle (and install the atfork handler once). */
void dkv__fork_own(dkv_log *log);
/* The error of a call on an inherited handle: the message, and DKV_EFORKED. */
int dkv__forked_error(dkv_log *log);
static inline int dkv__inherited(const dkv_log *log)
{
    return log->fork_gen != __atomic_load_n(&dkv__fork_gen, __ATOMIC_RELAXED);
}
/* The call in progress on a handle (DKV_OWNED): counted in log->calls until the calling
 * function returns (the cleanup attribute runs on every return), so that dkv_close, which
 * closes the descriptors and unmaps WSHM, waits for the calls other threads are in. */
static inline dkv_log *dkv__call_enter(dkv_log *log)
{
    __atomic_add_fetch(&log->calls, 1, __ATOMIC_SEQ_CST);     /* before any look at closed */
    return log;
}
static inline void dkv__call_leave(dkv_log **log)
{
    __atomic_sub_fetch(&(*log)->calls, 1, __ATOMIC_ACQ_REL);
}

/* First statement of every public call that takes mu: refuse an inherited handle before
 * touching its mutex (held, perhaps, by a thread this process does not have); then count
 * the call in progress until it returns. */
#define DKV_OWNED(log, fail_value)                                       \
    do {                                                                  \
        if (dkv__inherited(log)) {                                        \
            dkv__forked_error(log);                                       \
            return (fail_value);                                          \
        }                                                                 \
    } while (0);                                                          \
    dkv_log *dkv__in_call __attribute__((cleanup(dkv__call_leave), unused)) \
        = dkv__call_enter(log)

/* Record damage the handle found (dkv_last_damage) and say it in its error: "segment S
 * offset O: kind (detail)". Returns DKV_ECORRUPT. */
int dkv__damage_record(dkv_log *log, const char *seg, uint64_t off, int kind,
                       uint64_t lost_first, uint64_t lost_last, const char *detail);
/* Damage a recovery mode reads past: recorded if it is the handle's first finding (the one
 * dkv_last_damage shows), and no error, since the open goes on. */
void dkv__damage_read_past(dkv_log *log, const char *seg, uint64_t off, int kind,
                           uint64_t lost_first, uint64_t lost_last, const char *detail);
/* The segment after the loaded ones, or segment 0 of a new log (seglog.c). */
int dkv__create_next_segment(dkv_log *log);
/* Several writers (open.c): take WLOCK (mu not held), and catch up with frames other
 * processes appended (mu held, WLOCK held, nothing pending). */
int dkv__wlock_take(dkv_log *log);
int dkv__catch_up(dkv_log *log);
/* WSHM (wshm.c). Without a mapping every call is a no-op that claims nothing. */
uint64_t dkv__mono_ns(void);
/* Map it (before open takes WLOCK: a waiting opener asks a lease holder to let go too);
 * then, once the log is loaded, check it: alone (no other writer attached) or stale (not
 * this log's, or torn), rebuild it from the loaded log. Until checked only want_ns and
 * holder_pid are used, which nothing trusts. */
int dkv__shm_map(dkv_log *log);
void dkv__shm_check(dkv_log *log, int alone);
void dkv__shm_close(dkv_log *log);
/* A section wrote its frames (WLOCK held): publish the active segment and written_lsn. */
void dkv__shm_written(dkv_log *log);
/* A roll sealed (fdatasync'd) every frame below new_base. */
void dkv__shm_rolled(dkv_log *log, uint64_t new_base);
/* Before an fdatasync of the active segment (base: its base LSN, read under mu): the end
 * it will cover (own: what this handle wrote), announced as in flight. After it: publish
 * (ok) or poison (failed). Called without mu. */
uint64_t dkv__shm_cover(dkv_log *log, uint64_t base, uint64_t own);
void dkv__shm_synced(dkv_log *log, uint64_t cover, int ok, int turn);
/* Give the syncer's turn (dkv__shm_sync_turn) back without a publish (a failed write). */
void dkv__shm_turn_release(dkv_log *log);
int dkv__shm_poisoned(dkv_log *log);
uint64_t dkv__shm_durable(dkv_log *log);
/* Become the store's one syncer (1), or another process's fdatasync runs (0): sleep until
 * it publishes (at most timeout_us; a syncer found dead gives its turn up). A group-commit
 * leader's fdatasync (lead) runs with the turn; the async flusher's without it. */
int dkv__shm_sync_turn(dkv_log *log);
void dkv__shm_wait(dkv_log *log, uint64_t end, uint32_t timeout_us);
/* The lease: a WLOCK waiter marks itself until until_ns; a holder asks if one waits. */
void dkv__shm_want(dkv_log *log, uint64_t until_ns);
void dkv__shm_unwant(dkv_log *log);
int dkv__shm_wanted(dkv_log *log, uint64_t now_ns);
int dkv__shm_holder_is(dkv_log *log, uint32_t pid);
void dkv__shm_set_holder(dkv_log *log, uint32_t pid);
/* Enter (1) or leave (0) the calling thread's write section (mu held, seglog.c). */
int dkv__write_section(dkv_log *log, int enter);
/* Wait until no leader, flusher sync or roll runs (mu held, seglog.c). */
void dkv__quiesce(dkv_log *log);
/* The async flusher thread (seglog.c). */
void *dkv__flusher_main(void *arg);

/* 0, or why the handle cannot take this call (closed, failed, read-only). mu held.
 * write: 0 a read; DKV_USE_WRITE a new write, refused from dkv_close's start too;
 * DKV_USE_UNDERWAY a write already under way (a roll within an append or a seal), which
 * dkv_close waits for and flushes. */
#define DKV_USE_WRITE 1
#define DKV_USE_UNDERWAY 2
int dkv__usable(dkv_log *log, int write);
int dkv__load_index(dkv_log *log, seg_t *s);
/* next_lsn, durable_lsn and start_lsn are read without mu by dkv_next_lsn & co: their
 * writers (all under mu) store atomically. */
#define STORE_LSN(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)
int dkv__segs_reserve(dkv_log *log);
int dkv__index_push(seg_t *s, uint64_t off);
/* Point HEAD at the active segment, with log->epoch (writer; FORMAT.md §2a). 0 or -errno. */
int dkv__head_update(dkv_log *log);
/* dkv_open for recover: takes over the writer lock recover holds (lock_fd), does not check
 * HEAD (recover rewrites it) and accepts a missing prefix (recover raises start_lsn). */
int dkv__open_repair(const char *dir, int lock_fd, dkv_log **out);

/* ---- dkv_open's recovery modes (recover_open.c), on what open.c loads ---- */
/* What happened while loading one segment. */
typedef struct {
    int kind;               /* DKV_DAMAGE_NONE: loaded cleanly */
    uint64_t off;
    char detail[160];
    uint8_t *file;          /* the bytes of a segment left unsealed, when read whole */
    uint64_t size;
    int chunked;            /* the active segment, checked in chunks: digest holds its */
    uint32_t digest;        /* running digest of [0, data_end) and file is NULL */
    scan_result scan;
} load_result;

/* Damage in segment `name` (bases[i] of the listing bases[0..n); expect: the LSN it should
 * start at), by recovery mode: 0 to go on (*stop: point_in_time ends the log here) or the
 * error that refuses the open. */
int dkv__open_damage(dkv_log *log, const char *name, load_result *lr, const uint64_t *bases,
                     size_t n, size_t i, uint64_t expect, int *stop);
/* HEAD (as read before the listing bases[0..n), rc/why: how that read went) against the
 * loaded segments (FORMAT.md §2a). */
int dkv__open_check_head(dkv_log *log, const uint64_t *bases, size_t n, log_head hd, int rc,
                         const char *why);
/* The segments below start_lsn are gone. */
int dkv__open_missing_prefix(dkv_log *log);

/* ---- sealed segments' file descriptors (segfd.c), mu held unless said ---- */
/* An fd to read segment s, opened if needed. *own: the cache had no room, the caller
 * closes *fd when done. A failure to open sets the handle's error (path, strerror). */
int dkv__seg_fd(dkv_log *log, seg_t *s, int *fd, int *own);
/* The segment before the newest is no longer active: its open fd joins the cache. */
void dkv__seg_retire(dkv_log *log);
/* A reader keeps an fd past mu: pin under mu; unpin (without mu) after its pread. */
void dkv__fd_pin(dkv_log *log);
void dkv__fd_unpin(dkv_log *log);
/* Close every fd the cache evicted (dkv_close). */
void dkv__fd_close_grave(dkv_log *log);

#endif
