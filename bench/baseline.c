/* Baselines for bench/test_bench_log.py: what the hardware does with no log at all.
 *
 * raw_fsync_loop: n x (write(size) + fdatasync), the floor under a sync commit.
 * raw_write_loop: n x write(size), the floor under an async commit.
 * Both append to path (created/truncated) and return 0, or -errno on failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int loop(const char *path, int n, int size, int sync)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    char *buf = malloc(size > 0 ? (size_t)size : 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    memset(buf, 0xab, size > 0 ? (size_t)size : 1);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (write(fd, buf, (size_t)size) != size)
            rc = errno ? -errno : -EIO;
        else if (sync && fdatasync(fd) != 0)
            rc = -errno;
    }
    free(buf);
    close(fd);
    return rc;
}

int raw_fsync_loop(const char *path, int n, int size) { return loop(path, n, size, 1); }
int raw_write_loop(const char *path, int n, int size) { return loop(path, n, size, 0); }
