/* The hardware floor under a commit, with no log at all: n x write(size) to one file,
 * each followed by fdatasync when do_sync is set.
 *
 * `durkv bench` and the bench/ suites time this loop side by side with durkv's commits
 * (write+fdatasync is the floor under a `sync` commit, write alone under an `async`
 * one). It ships in durkv._seglog so that an installed durkv can measure its own disk.
 * It uses the plain system calls, not the log's counted and fault-injectable ones: it
 * must cost exactly what the hardware costs and leave the log's counters alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "seglog.h"

int dkv_raw_loop(const char *path, int n, int size, int do_sync, int *errno_out)
{
    *errno_out = 0;
    if (n < 0 || size < 1)
        return DKV_EINVAL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        *errno_out = errno;
        return DKV_EIO;
    }
    char *buf = malloc((size_t)size);
    if (!buf) {
        close(fd);
        return DKV_ENOMEM;
    }
    memset(buf, 0xab, (size_t)size);
    int rc = DKV_OK;
    for (int i = 0; i < n && rc == DKV_OK; i++) {
        ssize_t w = write(fd, buf, (size_t)size);
        if (w != size) {
            *errno_out = w < 0 ? errno : ENOSPC;   /* a short append: the disk is full */
            rc = DKV_EIO;
        } else if (do_sync && fdatasync(fd) != 0) {
            *errno_out = errno;
            rc = DKV_EIO;
        }
    }
    free(buf);
    if (close(fd) != 0 && rc == DKV_OK) {
        *errno_out = errno;
        rc = DKV_EIO;
    }
    return rc;
}
