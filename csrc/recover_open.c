/* What each recovery mode does with the damage dkv_open finds (FORMAT.md §6): strict
 * refuses everything; tolerate_tail repairs a torn tail (a writer moves it to quarantine/)
 * and refuses corruption; point_in_time ends the log before the first damage, read-only;
 * salvage reads every valid frame it can reach, read-only. The first finding is what the
 * handle reports (dkv_last_damage). open.c loads the segments and calls these. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log_int.h"

/* A point_in_time or salvage handle that found damage: read-only, no lock. */
static void go_read_only(dkv_log *log)
{
    log->opt.read_only = 1;
    if (log->lock_fd >= 0)
        close(log->lock_fd);
    log->lock_fd = -1;
    if (log->wlock_fd >= 0)
        close(log->wlock_fd);   /* releases WLOCK if open held it */
    log->wlock_fd = -1;
    log->shared = 0;
    dkv__shm_close(log);
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
    char path[DKV_PATH_MAX];
    int fd = dkv__seg_path(path, log->dir, bases[n - 1]) ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    uint8_t *b = NULL;
    uint64_t size = 0, last = bases[n - 1] ? bases[n - 1] - 1 : NO_LSN;
    seg_header h;
    if (fd >= 0 && dkv__read_file(fd, &b, &size) == 0 &&
        dkv__header_decode(b, size, &h, NULL) == 0) {
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

/* A torn tail in segment `name`: strict refuses; the other modes report it and a writer
 * moves it to quarantine/ (the whole file when its header was torn). */
static int on_torn_tail(dkv_log *log, const char *name, const load_result *lr, uint64_t expect)
{
    int mode = log->opt.recovery;
    int whole = !lr->file;          /* a torn segment header: the file never got going */
    uint64_t off = whole ? 0 : lr->off;
    if (mode == DKV_RECOVER_STRICT)
        return dkv__damage_record(log, name, off, lr->kind, expect, NO_LSN, lr->detail);
    if (!log->has_damage || mode != DKV_RECOVER_SALVAGE)
        dkv__damage_record(log, name, off, lr->kind, expect, NO_LSN, lr->detail);
    log->err[0] = 0;
    if (log->opt.read_only)
        return 0;
    int rc;
    if (whole) {
        rc = dkv__quarantine_whole(log->dir, name);
    } else {
        seg_t *s = &log->segs[log->nsegs - 1];
        rc = dkv__quarantine_tail(log->dir, name, s->fd, lr->file, lr->size, off);
        s->file_size = off;
    }
    if (rc)
        return dkv__io_error(log, -rc, "cannot repair the torn tail of %s/%s", log->dir, name);
    return 0;
}

/* Corruption in segment i: strict and tolerate_tail refuse; salvage reports it and reads
 * on; point_in_time reports it and ends the log before it, read-only (*stop). */
static int on_corruption(dkv_log *log, const char *name, load_result *lr,
                         const uint64_t *bases, size_t n, size_t i, uint64_t expect, int *stop)
{
    int mode = log->opt.recovery;
    if (mode == DKV_RECOVER_SALVAGE && lr->file) {
        seg_t *s = &log->segs[log->nsegs - 1];
        dkv__damage_read_past(log, name, lr->off, lr->kind, s->base_lsn + s->count, NO_LSN,
                              lr->detail);
        return salvage_rest(log, s, lr);
    }
    if (mode == DKV_RECOVER_SALVAGE) {     /* an unreadable header: skip the file */
        dkv__damage_read_past(log, name, lr->off, lr->kind, bases[i], NO_LSN, lr->detail);
        return 0;
    }
    int rc = dkv__damage_record(log, name, lr->off, lr->kind, expect,
                                mode == DKV_RECOVER_POINT_IN_TIME ? last_lsn_on_disk(log, bases, n)
                                                                  : NO_LSN,
                                lr->detail);
    if (mode != DKV_RECOVER_POINT_IN_TIME)
        return rc;
    /* point_in_time: the log ends at the last good frame before the damage, and the
     * handle is read-only until `durkv recover --skip-corrupt` cuts it. */
    log->cut = 1;
    go_read_only(log);
    *stop = 1;
    return 0;
}

/* A finding in segment i of the listing bases[0..n) while loading (FORMAT.md §6). */
int dkv__open_damage(dkv_log *log, const char *name, load_result *lr, const uint64_t *bases,
                     size_t n, size_t i, uint64_t expect, int *stop)
{
    if (lr->kind == DKV_DAMAGE_TORN_TAIL)
        return on_torn_tail(log, name, lr, expect);
    return on_corruption(log, name, lr, bases, n, i, expect, stop);
}

/* HEAD against the segment files (FORMAT.md §2a). hd/rc/why: HEAD as read BEFORE the
 * directory was listed (a writer names a segment in HEAD only once its file exists, so a
 * concurrent roll cannot make HEAD name a file the listing missed). bases: the listing,
 * n > 0. Returns 0 (no finding, or one the mode reads past) or DKV_ECORRUPT / DKV_EIO. */
int dkv__open_check_head(dkv_log *log, const uint64_t *bases, size_t n, log_head hd, int rc,
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
    char name[64], detail[160];
    uint64_t off = 0;
    int kind;
    if (rc) {
        kind = DKV_DAMAGE_BAD_HEADER;
        snprintf(name, sizeof name, "HEAD");
        snprintf(detail, sizeof detail, "%s", why);
    } else {
        kind = dkv__check_head(&hd, log->uuid, 1, bases[n - 1], name, &off, detail, sizeof detail);
    }
    if (!kind)
        return 0;
    uint64_t first = kind == DKV_DAMAGE_MISSING ? a->base_lsn + a->count : NO_LSN;
    int mode = log->opt.recovery;
    if (mode != DKV_RECOVER_SALVAGE && mode != DKV_RECOVER_POINT_IN_TIME)
        return dkv__damage_record(log, name, off, kind, first, NO_LSN, detail);
    dkv__damage_read_past(log, name, off, kind, first, NO_LSN, detail);
    if (mode == DKV_RECOVER_POINT_IN_TIME) {
        log->cut = 1;
        go_read_only(log);
    }
    return 0;
}

/* The segments below start_lsn are gone: strict and tolerate_tail refuse; salvage and
 * point_in_time read what remains (from the first segment on) and report the lost prefix;
 * `recover --skip-corrupt` makes it permanent. */
int dkv__open_missing_prefix(dkv_log *log)
{
    char name[64];
    uint64_t first = log->segs[0].base_lsn;
    dkv__seg_name(name, first);
    int mode = log->opt.recovery;
    if (mode != DKV_RECOVER_SALVAGE && mode != DKV_RECOVER_POINT_IN_TIME)
        return dkv__damage_record(log, name, 0, DKV_DAMAGE_MISSING, log->start_lsn, first - 1,
                                  "segments below it are missing");
    dkv__damage_read_past(log, name, 0, DKV_DAMAGE_MISSING, log->start_lsn, first - 1,
                          "segments below it are missing");
    log->start_lsn = first;
    go_read_only(log);
    return 0;
}
