/* Sealed segments' file descriptors: opened on demand, at most SEALED_FDS kept open.
 *
 * A log of thousands of segments must open under the default `ulimit -n 1024` (and leave
 * the process its descriptors), so the number of open fds may not grow with the log. The
 * active segment's fd lives as long as it is active; a sealed segment's is opened by the
 * first read that needs it and cached, oldest evicted first (sealed segments are read
 * mostly newest-first and in runs, so FIFO keeps the hot ones).
 *
 * Readers pread outside mu with an fd they got under mu, so an evicted fd cannot simply be
 * closed: a reader counts itself in fd_readers (incremented under mu, decremented without
 * it after the pread), and an fd evicted while fd_readers > 0 waits in `grave` until the
 * count drops to 0. Eviction and the increment both happen under mu, so a count of 0 seen
 * under mu means no reader holds any evicted fd. When many fds wait already, a reader gets
 * a private fd instead, which it closes itself: the count stays bounded either way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log_int.h"

/* Hand an evicted fd over: closed now if no reader can hold it, else kept in the grave. */
static int bury(dkv_log *log, int fd, int force)
{
    if (!__atomic_load_n(&log->fd_readers, __ATOMIC_ACQUIRE)) {
        close(fd);
        return 0;
    }
    if (log->ngrave >= SEALED_FDS && !force)
        return -1;
    if (DKV_RESERVE(log->grave, log->cap_grave, (size_t)log->ngrave + 1, 16))
        return -1;
    log->grave[log->ngrave] = fd;
    __atomic_store_n(&log->ngrave, log->ngrave + 1, __ATOMIC_RELEASE);
    return 0;
}

/* Make room for one more cached fd. 0, or -1 if the oldest cannot be evicted now. */
static int make_room(dkv_log *log, int force)
{
    if (log->fd_n < SEALED_FDS)
        return 0;
    seg_t *old = &log->segs[log->fd_ring[log->fd_pos]];
    if (bury(log, old->fd, force))
        return -1;
    old->fd = -1;
    old->fd_cached = 0;
    log->fd_n--;
    log->fd_pos = (log->fd_pos + 1) % SEALED_FDS;
    return 0;
}

static void cache(dkv_log *log, seg_t *s)
{
    log->fd_ring[(log->fd_pos + log->fd_n) % SEALED_FDS] = (size_t)(s - log->segs);
    log->fd_n++;
    s->fd_cached = 1;
}

int dkv__seg_fd(dkv_log *log, seg_t *s, int *fd, int *own)
{
    *own = 0;
    if (s->fd >= 0) {
        *fd = s->fd;
        return 0;
    }
    char path[DKV_PATH_MAX];
    int f = dkv__seg_path(path, log->dir, s->base_lsn) ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0) {
        if (errno != ENOENT)
            return dkv__io_error(log, errno, "cannot open segment %s", path);
        dkv__io_error(log, errno, "segment %s was removed (compacted away) since this handle "
                      "opened the log: reopen or refresh it; cannot open it", path);
        return DKV_ENOLSN;      /* the frame is gone, like an lsn below start_lsn */
    }
    /* The same file as at load, or this handle's index describes another one: recover moved
     * the segment to quarantine/ and a writer made a new file of that name (GUARANTEES 9). */
    struct stat st;
    if (fstat(f, &st) || (uint64_t)st.st_dev != s->dev || (uint64_t)st.st_ino != s->ino) {
        close(f);
        dkv__set_error(log, "segment %s was replaced since this handle opened the log "
                       "(a repair ran): reopen or refresh it", path);
        return DKV_ESTALE;
    }
    *fd = f;
    if (make_room(log, 0)) {
        *own = 1;
        return 0;
    }
    s->fd = f;
    cache(log, s);
    return 0;
}

void dkv__seg_retire(dkv_log *log)
{
    if (log->nsegs < 2)
        return;
    seg_t *s = &log->segs[log->nsegs - 2];
    if (s->fd < 0 || s->fd_cached)
        return;
    if (!make_room(log, 1))     /* else out of memory: it stays open, uncached, until close */
        cache(log, s);
}

void dkv__fd_pin(dkv_log *log) { __atomic_add_fetch(&log->fd_readers, 1, __ATOMIC_ACQ_REL); }

void dkv__fd_unpin(dkv_log *log)
{
    if (__atomic_sub_fetch(&log->fd_readers, 1, __ATOMIC_ACQ_REL) ||
        !__atomic_load_n(&log->ngrave, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&log->mu);
    if (!__atomic_load_n(&log->fd_readers, __ATOMIC_ACQUIRE))
        dkv__fd_close_grave(log);
    pthread_mutex_unlock(&log->mu);
}

void dkv__fd_close_grave(dkv_log *log)
{
    for (unsigned i = 0; i < log->ngrave; i++)
        close(log->grave[i]);
    __atomic_store_n(&log->ngrave, 0, __ATOMIC_RELEASE);
}
