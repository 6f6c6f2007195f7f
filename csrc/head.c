/* HEAD (FORMAT.md §2a): the newest segment and the repair epoch, in a small file
 * replaced atomically (write HEAD.tmp, fdatasync, rename, directory fsync) so that deleting
 * the newest segments cannot go unnoticed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "log_int.h"

#define HEAD_MAGIC "DKVHEAD\x01"

int dkv__head_read(const char *dir, log_head *h, const char **why)
{
    char p[DKV_PATH_MAX];
    int fd = dkv__path(p, dir, "HEAD") ? -1 : open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? DKV_ENOENT : DKV_EIO;
    uint8_t b[HEAD_LEN + 1];
    int r = dkv__pread_all(fd, b, sizeof b, 0);
    close(fd);
    if (r < 0)
        return DKV_EIO;
    const char *bad = NULL;
    if (r != HEAD_LEN)
        bad = "HEAD has the wrong size";
    else if (memcmp(b, HEAD_MAGIC, 8))
        bad = "HEAD has a bad magic";
    else if (dkv_crc32c(0, b, 60) != get32(b + 60))
        bad = "HEAD checksum mismatch";
    if (bad) {
        if (why)
            *why = bad;
        return DKV_ECORRUPT;
    }
    memcpy(h->uuid, b + 8, 16);
    h->segment_no = get64(b + 24);
    h->base_lsn = get64(b + 32);
    h->epoch = get64(b + 40);
    return 0;
}

int dkv__head_write(const char *dir, const log_head *h)
{
    uint8_t b[HEAD_LEN] = {0};
    memcpy(b, HEAD_MAGIC, 8);
    memcpy(b + 8, h->uuid, 16);
    put64(b + 24, h->segment_no);
    put64(b + 32, h->base_lsn);
    put64(b + 40, h->epoch);
    put32(b + 60, dkv_crc32c(0, b, 60));
    char tmp[DKV_PATH_MAX], p[DKV_PATH_MAX];
    if (dkv__path(tmp, dir, "HEAD.tmp") || dkv__path(p, dir, "HEAD"))
        return -errno;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = dkv__pwrite_all(fd, b, HEAD_LEN, 0);
    if (!rc)
        rc = dkv__fdatasync(fd);
    close(fd);
    if (!rc && rename(tmp, p))
        rc = -errno;
    if (!rc)
        rc = dkv__dirfsync(dir);
    return rc;
}

int dkv__head_update(dkv_log *log)
{
    log_head h;
    const seg_t *a = &log->segs[log->nsegs - 1];
    memcpy(h.uuid, log->uuid, 16);
    h.segment_no = a->segment_no;
    h.base_lsn = a->base_lsn;
    h.epoch = log->epoch;
    return dkv__head_write(log->dir, &h);
}
