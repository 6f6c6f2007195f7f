/* durkv segment log: the C API. The on-disk format is docs/FORMAT.md.
 *
 * Conventions: every function returns 0 or a negative DKV_E* code; out-params
 * come last; dkv_strerror() names a code, dkv_last_error() gives the handle's
 * detailed message ("segment 0000000000000000.seg offset 4096: checksum_mismatch").
 * Handles are opaque; every dkv_open has a dkv_destroy (after a dkv_close, or doing it).
 * The library never calls back into Python. All calls are safe to make without the GIL:
 * a dkv_log is internally locked, and appends from several threads are group-committed.
 *
 * A handle belongs to the process that opened it. In a child made by fork() every call on
 * an inherited handle returns DKV_EFORKED without touching its locks or files (a mutex may
 * be held by a thread the child does not have, and the flusher thread is not there), and
 * dkv_close only closes the child's copies of its file descriptors: no flush, no write,
 * no fsync. The child opens the log again if it needs it.
 */
#ifndef DKV_SEGLOG_H
#define DKV_SEGLOG_H

#include <stddef.h>
#include <stdint.h>

/* error codes */
#define DKV_OK 0
#define DKV_EIO -1          /* open/write/fsync/read failed (dkv_last_errno: the errno) */
#define DKV_ECORRUPT -2     /* corruption found; see dkv_last_damage() */
#define DKV_ELOCKED -3      /* another writer holds LOCK */
#define DKV_EFAILED -4      /* handle failed closed after an earlier I/O error */
#define DKV_EINVAL -5       /* bad argument (unknown lsn, bad option, frame too large) */
#define DKV_ENOENT -6       /* no log at that path (read-only open) */
#define DKV_EREADONLY -7    /* write on a read-only handle */
#define DKV_ENOMEM -8
#define DKV_ECLOSED -9      /* handle already closed */
#define DKV_ESTALE -10      /* read-only handle: the log was repaired since it opened; reopen */
#define DKV_ETOOBIG -11     /* a frame larger than the 1 GiB limit */
#define DKV_ENOLSN -12      /* no such frame: lsn not in the log, lost to damage, not appended */
#define DKV_EFORKED -13     /* the handle was opened by another process: this one is a fork */

/* not an error: dkv_append_one's answer when the log is not where the caller expected
 * (nothing appended); negative so that it is never an LSN */
#define DKV_MOVED -14
/* not an error: the try calls' answer when they would wait (nothing done) */
#define DKV_WOULD_WAIT -15

/* durability policies */
#define DKV_SYNC 0
#define DKV_ASYNC 1
#define DKV_EXIT 2

/* recovery modes */
#define DKV_RECOVER_TOLERATE_TAIL 0
#define DKV_RECOVER_STRICT 1
#define DKV_RECOVER_POINT_IN_TIME 2
#define DKV_RECOVER_SALVAGE 3

/* frame types */
#define DKV_FRAME_DATA 1
#define DKV_FRAME_COMMIT 2

/* channel entry kinds and flags (docs/FORMAT.md §5) */
#define DKV_ENTRY_FULL 1
#define DKV_ENTRY_DELTA 2
#define DKV_ENTRY_SNAP 3
#define DKV_ENTRY_F_ZSTD 1
#define DKV_ENTRY_F_VALUE 2
#define DKV_ENTRY_F_REFS 4    /* a DELTA whose items are 12-byte refs to FULL list entries */

/* damage kinds */
#define DKV_DAMAGE_NONE 0
#define DKV_DAMAGE_CHECKSUM 1       /* "checksum_mismatch" */
#define DKV_DAMAGE_BAD_HEADER 2     /* "bad_header" */
#define DKV_DAMAGE_TORN_TAIL 3      /* "torn_tail" */
#define DKV_DAMAGE_LSN_GAP 4        /* "lsn_gap" */
#define DKV_DAMAGE_MISSING 5        /* "missing_segment" */
#define DKV_DAMAGE_FOREIGN 6        /* "foreign_segment" */
#define DKV_DAMAGE_BAD_SEAL 7       /* "bad_seal" */
#define DKV_DAMAGE_BROKEN_CHAIN 8   /* "broken_chain" */

typedef struct dkv_log dkv_log;

typedef struct {
    int durability;             /* DKV_SYNC / DKV_ASYNC / DKV_EXIT */
    int recovery;               /* DKV_RECOVER_* */
    int read_only;              /* 1: no lock, no writes, no repair */
    uint64_t segment_bytes;     /* roll threshold; 0 = default 64 MiB */
    uint32_t flush_interval_ms; /* async flusher bound; 0 = default 10 */
    uint32_t lock_timeout_ms;   /* longest wait for the write lock (WLOCK); 0 = default 10000 */
} dkv_options;

/* One damage finding: which file, where, what. */
typedef struct {
    char segment[64];           /* file name, e.g. "0000000000000000.seg" */
    uint64_t offset;            /* byte offset in that file */
    int kind;                   /* DKV_DAMAGE_* */
    uint64_t lost_first_lsn;    /* LSN range this damage makes unreadable, if known */
    uint64_t lost_last_lsn;     /*   (lost_first > lost_last means none / unknown) */
    char detail[160];
} dkv_damage;

/* Per-segment verify result. */
typedef struct {
    char segment[64];
    int sealed;
    uint64_t segment_no;
    uint64_t base_lsn;
    uint64_t frames_ok;         /* frames that passed every check */
    uint64_t bytes;             /* file size */
    int kind;                   /* first damage kind in this segment, DKV_DAMAGE_NONE if clean */
    uint64_t bad_offset;        /* offset of the first damage */
    char detail[160];
} dkv_segment_report;

typedef struct {
    size_t n_segments;
    dkv_segment_report *segments;   /* owned by the report */
    size_t n_damage;
    dkv_damage *damage;             /* every finding, in file order */
    uint64_t frames_ok;
    uint64_t next_lsn;              /* LSN after the last readable frame */
    uint64_t transients;            /* recover: <segment>.tmp / HEAD.tmp files removed
                                       (under dry_run: found, and left) */
} dkv_report;

const char *dkv_strerror(int code);
const char *dkv_damage_name(int kind);
int dkv_crc32c_hw(void);                                  /* 1 if SSE4.2 is in use */
int dkv_crc32c_clmul(void);                               /* 1 if PCLMULQDQ folds long buffers */
uint32_t dkv_crc32c(uint32_t seed, const uint8_t *buf, size_t len);
uint32_t dkv_crc32c_portable(uint32_t seed, const uint8_t *buf, size_t len);

/* Open (creating the directory and segment 0 if a writer finds no log). On failure *out
 * may still hold a handle (so dkv_last_error/dkv_last_damage can explain the failure);
 * the caller dkv_destroy()s it, and every other call on it returns DKV_ECLOSED. */
int dkv_open(const char *dir, const dkv_options *opt, dkv_log **out);
/* Flush (all policies), stop the flusher, close the files and release the locks. Other
 * threads may be in calls on the handle meanwhile, or make them after: an append begun
 * after dkv_close's start returns DKV_ECLOSED (nothing appended), one under way is
 * appended whole, and the flush covers every frame appended (an append returns
 * DKV_ECLOSED only when none of it is in the log). Every other call returns DKV_ECLOSED
 * or completes; dkv_close waits for them to leave before it closes a file, and frees the
 * frame indexes and buffers then.
 * The memory stays, for such calls, until dkv_destroy. Idempotent; NULL-safe. */
int dkv_close(dkv_log *log);
/* dkv_close if not done, then free the handle. No call may be in progress or follow. */
void dkv_destroy(dkv_log *log);
/* The handle's last detailed error message ("" if none). Valid until the next call.
 * NULL: the calling thread's last error of a call without a handle (dkv_verify,
 * dkv_recover). An I/O error's message names the file and ends with strerror(errno). */
const char *dkv_last_error(dkv_log *log);
/* The errno behind that error (0 if it was not an I/O error). Same NULL rule. */
int dkv_last_errno(dkv_log *log);
/* The damage that made dkv_open fail, or a recovery report (point_in_time). */
int dkv_last_damage(dkv_log *log, dkv_damage *out);

/* Append one frame; returns after the policy's promise holds (sync: durable).
 * durability: DKV_SYNC/ASYNC/EXIT for this call, or -1 for the handle's policy. A weaker
 * per-call policy is how pending writes ride on the next commit's fsync: under ASYNC the
 * frame is written to the OS before return, so a process kill cannot lose it. */
int dkv_append(dkv_log *log, uint8_t type, const uint8_t *buf, uint32_t len, int durability,
               uint64_t *lsn_out);
/* dkv_append with the handle's frame bytes as `const char *` (so a binding can pass an
 * immutable byte string without a copy) and the LSN as the result: >= 0 is the frame's
 * LSN, < 0 a DKV_E* code. The hot path of the Python wrapper. */
int64_t dkv_append_lsn(dkv_log *log, uint8_t type, const char *buf, uint32_t len, int durability);
/* dkv_append_lsn when it cannot wait for another thread that may need the caller's GIL:
 * in this thread's own write section (or on a handle that shares no write lock), under
 * `exit` or `async`, a frame under 64 KiB while under 64 KiB waits to be written, no
 * roll running and none needed for this frame, no other leader writing. Otherwise
 * DKV_WOULD_WAIT, nothing appended: call dkv_append_lsn. Every try call also refuses when
 * another thread holds the handle's mutex past a short spin (~20 us: it may be doing disk
 * work under it). What a try call still waits for is the log's own short work, which
 * never takes a GIL (see dkv_write_begin_try). */
int64_t dkv_append_try(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                       int durability);
/* One frame in a write section of its own: dkv_write_begin, dkv_append_lsn and
 * dkv_write_end in one call, under the same rules as the three (WLOCK taken, other
 * processes' frames caught up with, the frame written under `durability` before the
 * section ends), for a caller that holds no section. `expect` is the LSN the caller's own
 * view of the log (its index) says comes next: when the caught-up log's next LSN is
 * another -- some process appended since that view was taken -- nothing is appended and
 * DKV_MOVED is returned: the caller takes those frames in first (dkv_write_begin, its
 * catch-up, dkv_append_lsn, dkv_write_end). Otherwise as dkv_append_lsn: the LSN, or a
 * DKV_E* code. The hot path of a run's journal record (one GIL hand-off, not three). */
int64_t dkv_append_one(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                       int durability, uint64_t expect);
/* dkv_append_one when it cannot wait for another thread that may need the caller's GIL:
 * refused (DKV_WOULD_WAIT, nothing done) where dkv_write_begin_try or dkv_append_try
 * would refuse -- a section that would wait, `sync`, 64 KiB or more to move, a roll or
 * another leader's write, the mutex busy. */
int64_t dkv_append_one_try(dkv_log *log, uint8_t type, const char *buf, uint32_t len,
                           int durability, uint64_t expect);
/* Append n frames as one group (one write, one fsync under sync); LSNs are first..first+n-1.
 * The n payloads are packed back to back in `data` (lens[i] bytes each). */
int dkv_append_packed(dkv_log *log, uint8_t type, const char *data, const uint32_t *lens,
                      uint32_t n, int durability, uint64_t *first_lsn_out);
/* Make everything appended so far durable (write + fdatasync), under any policy. */
int dkv_flush(dkv_log *log);
/* Block until frames below lsn+1 are durable (async: waits for the flusher). */
int dkv_wait_durable(dkv_log *log, uint64_t lsn);
/* Block until frames below lsn+1 are written to the OS, writing them itself if no leader
 * runs, and hand them to the flusher: the whole async promise (they survive a process kill
 * now, and a power loss once the flusher's fdatasync runs, within flush_interval_ms). With
 * dkv_append under DKV_EXIT it lets a caller queue a frame under its own lock and wait for
 * the write after releasing it, instead of holding that lock behind a running fdatasync. */
int dkv_wait_written(dkv_log *log, uint64_t lsn);
/* Number of frames known durable: frames with lsn < durable are durable. */
uint64_t dkv_durable_lsn(dkv_log *log);
/* fdatasyncs run by group-commit leaders of this handle (frames per sync: group size). */
uint64_t dkv_commit_syncs(dkv_log *log);
/* The header flags of the active segment as this handle last loaded it (FORMAT.md §2:
 * bit 0 STEP_IDS), 0 when the log has none. */
uint32_t dkv_active_flags(dkv_log *log);
/* fdatasyncs run by this handle's async flusher (what makes async frames durable). */
uint64_t dkv_flusher_syncs(dkv_log *log);
/* Successful fdatasync calls the library made in this process, on any file (a witness for
 * tests and benchmarks: frames, segment headers, seals, HEAD, quarantine copies). */
uint64_t dkv_fdatasync_count(void);
/* LSN the next append will get (= number of frames in the log incl. removed prefix). */
uint64_t dkv_next_lsn(dkv_log *log);
/* Where the log keeps that LSN, for a caller that cannot afford a call per read (from
 * Python every cffi call hands the GIL over, and a commit read it twice). Valid until
 * dkv_destroy; read it as one aligned 64-bit load. */
const uint64_t *dkv_next_lsn_at(dkv_log *log);
/* Lowest live LSN (start_lsn of FORMAT.md §7). */
uint64_t dkv_start_lsn(dkv_log *log);
/* Several writers (FORMAT.md §12): take the store's cross-process write lock
 * (WLOCK) for the calling thread and catch up with the frames other processes appended
 * (repairing a dead writer's torn tail), so that the LSNs appends get next are the log's.
 * Nested calls by the holding thread count; other threads of the process wait. An append
 * outside a section takes one for itself. DKV_ELOCKED (naming the holder's pid) after
 * lock_timeout_ms. dkv_write_end writes every frame appended in the section (no fsync)
 * and releases the lock. */
int dkv_write_begin(dkv_log *log);
/* dkv_write_begin when it returns without waiting: a nested section, or the section free
 * and this process holding WLOCK's lease (no other process appended since its last
 * section). Otherwise DKV_WOULD_WAIT, nothing held: call dkv_write_begin. For a caller that
 * keeps a Python thread's GIL through the call (durkv._heldcall): every wait it would
 * have is on another thread that may need that GIL to go on. */
int dkv_write_begin_try(dkv_log *log);
int dkv_write_end(dkv_log *log);
/* dkv_write_end, and when it ends the outermost section (returns 0) every frame appended
 * so far is written and owes the flusher an fdatasync within flush_interval_ms, as
 * dkv_wait_written would leave it: an async commit's section end and its wait in one call
 * (from Python, one GIL hand-off instead of two). Returns 1 when it wrote nothing (a
 * nested section, or a handle that shares no write lock): wait for the frames as usual. */
int dkv_write_end_async(dkv_log *log);
/* dkv_write_end (owe_flush 0) or dkv_write_end_async (1) when under 64 KiB waits to be
 * written and no roll or other leader's write runs; otherwise DKV_WOULD_WAIT, the
 * section still held: call the blocking one (see dkv_append_try). */
int dkv_write_end_try(dkv_log *log, int owe_flush);
/* Several writers: the store's shared watermark (WSHM, FORMAT.md §12): frames below
 * *durable were fdatasync'd by some process; *publishes counts the fdatasyncs (and
 * failures) published so far. DKV_EINVAL on a handle that shares none (read-only). A
 * witness for tests and benchmarks. */
int dkv_shared_durable(dkv_log *log, uint64_t *durable, uint64_t *publishes);
/* Try to hold LOCK exclusively (on=1: no other handle attached; DKV_ELOCKED if one is) or
 * go back to sharing it (on=0): compaction runs with the store alone. */
int dkv_exclusive(dkv_log *log, int on);
/* Read-only handles: pick up frames a concurrent writer appended since open. Writers:
 * catch up with the frames other processes appended (an empty write section). */
int dkv_refresh(dkv_log *log);

/* Read a frame into a malloc'd buffer (one call, one pread); free it with dkv_free. Every
 * read checks the frame's crc: DKV_ECORRUPT (see dkv_last_damage) if it fails. */
int dkv_read_alloc(dkv_log *log, uint64_t lsn, uint8_t **buf_out, uint32_t *len_out,
                   uint8_t *type_out);

/* The heads of the COMMIT frames lsns[0..n) in that order, as one msgpack array (0xdd,
 * count, then each head's bytes): a run's journal in one call. Free with dkv_free. */
int dkv_read_heads(dkv_log *log, const uint64_t *lsns, size_t n, uint8_t **buf_out,
                   size_t *len_out);

/* The summed payload length of frames lsns[0..n), from the segments' frame offsets: no
 * frame is read. *done: how many of lsns (a prefix) were counted; a frame whose size the
 * offsets do not pin down (a neighbour lost to damage) stops the count there, and the
 * caller reads the rest. */
int dkv_payload_bytes(dkv_log *log, const uint64_t *lsns, size_t n, uint64_t *total,
                     size_t *done);

/* Check n LSNs stored as little-endian u64 (a K_INDEX snapshot's arrays, FORMAT.md 5):
 * 0 each in [lo, hi) and in order, 1 one outside [lo, hi), 2 out of order. order: 0 any,
 * 1 non-decreasing, 2 strictly ascending. */
int dkv_lsns_check(const uint8_t *le, size_t n, uint64_t lo, uint64_t hi, int order);

/* Seal the active segment and start a new one (new_start_lsn: 0 keeps start_lsn;
 * otherwise sets it, see FORMAT.md §7, and unlinks sealed segments below it). */
int dkv_seal(dkv_log *log, uint64_t new_start_lsn);
/* Segment list: n entries of report rows (no verification, just header/trailer facts). */
int dkv_segments(dkv_log *log, dkv_report **out);

/* COMMIT payloads (FORMAT.md §5): pure decoding functions on buffers. Frames are
 * encoded by durkv.payload in Python (cheaper than marshalling items through cffi). */
typedef struct {
    uint8_t kind, flags;
    uint32_t depth;
    uint64_t prev_lsn;
    uint32_t prev_idx;
    uint32_t n_items;
} dkv_entry_desc;
/* Decode: head location and entry count; DKV_ECORRUPT if the payload is malformed. */
int dkv_commit_head(const uint8_t *payload, size_t len, uint32_t *head_off, uint32_t *head_len,
                    uint32_t *n_entries);
/* Entry idx: its descriptor and the offset of its first item (items follow as len:u32 bytes). */
int dkv_commit_entry(const uint8_t *payload, size_t len, uint32_t idx, dkv_entry_desc *out,
                     uint32_t *items_off);

/* lost_last_lsn == UINT64_MAX in a dkv_damage means "to the end of the log / unknown". */

/* A channel's materialized item list: walks DELTA/SNAP references from (lsn, idx) and
 * returns every item in list order as one buffer of (len:u32, bytes) records. The caller
 * frees it with dkv_free. flags_out gets the FULL entry's flags (VALUE, ZSTD). */
int dkv_read_channel(dkv_log *log, uint64_t lsn, uint32_t idx, uint8_t **buf_out,
                     size_t *len_out, uint32_t *n_items_out, uint32_t *flags_out);

/* Progress of a long call: called after each segment file with (ctx, segments done,
 * segments in all). NULL: none. It must not call back into the log. */
typedef void (*dkv_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Verify a log directory without taking the write lock. deep: also decode COMMIT frames
 * and resolve every channel reference. Findings go in the report (a torn tail included);
 * the return code is only for failures to run (DKV_ENOENT, DKV_EIO, DKV_ENOMEM). */
int dkv_verify(const char *dir, int deep, dkv_progress_fn progress, void *ctx,
               dkv_report **out);
/* Repair: quarantine + truncate a torn tail; with skip_corrupt, also cut mid-log damage
 * (copying every removed byte to quarantine/ first). dry_run: report what would change.
 * Takes the writer lock (DKV_ELOCKED if a writer is open) unless dry_run. Without
 * skip_corrupt, mid-log damage returns DKV_ECORRUPT with *out still set to the findings. */
int dkv_recover(const char *dir, int skip_corrupt, int dry_run, dkv_progress_fn progress,
                void *ctx, dkv_report **out);
void dkv_report_free(dkv_report *r);
void dkv_free(void *p);

/* Test hook: make the nth next call of op fail with errno err, or, with err
 * DKV_FAULT_KILL (-1), SIGKILL the process right there: a crash at an exact point.
 * op: 1 write, 2 fdatasync, 3 directory fsync. n=0 disables. Process-wide. */
#define DKV_FAULT_KILL -1
int dkv_fault_inject(int op, int nth, int err);
/* Test hook: the nth next call of op sleeps ms milliseconds first, then runs (a slow
 * disk at an exact point: what waits for it, and what does not). */
int dkv_fault_pause(int op, int nth, int ms);

/* The floor under a commit (rawio.c): n x write(size) to path (created/truncated), each
 * followed by fdatasync when do_sync. Plain system calls: no fault hook, not counted.
 * DKV_EIO sets *errno_out; DKV_EINVAL for n < 0 or size < 1. */
int dkv_raw_loop(const char *path, int n, int size, int do_sync, int *errno_out);

#endif
