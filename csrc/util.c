/* Two chores every file of the log does: growing an array, and naming a file of the store
 * directory. Written once so that a failure reads the same wherever it happens. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dkv_internal.h"

void *dkv__grow(void *v, size_t *cap, size_t need, size_t size, size_t first)
{
    if (v && need <= *cap)
        return v;
    size_t nc = *cap ? *cap : first;
    while (nc < need) {
        if (nc > SIZE_MAX / 2)
            return NULL;
        nc *= 2;
    }
    if (nc > SIZE_MAX / size)
        return NULL;
    void *p = realloc(v, nc * size);
    if (p)
        *cap = nc;
    return p;
}

int dkv__path(char out[DKV_PATH_MAX], const char *dir, const char *fmt, ...)
{
    int n = snprintf(out, DKV_PATH_MAX, "%s/", dir);
    if (n >= 0 && n < DKV_PATH_MAX) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(out + n, DKV_PATH_MAX - (size_t)n, fmt, ap);
        va_end(ap);
        n = m < 0 ? m : n + m;
    }
    if (n >= 0 && n < DKV_PATH_MAX)
        return 0;
    errno = ENAMETOOLONG;   /* what open(2) says of a longer path: callers report it alike */
    return -1;
}
