/* The on-disk format of docs/FORMAT.md (headers, frames, trailers, directory listing) and
 * the I/O wrappers every write and sync goes through, so tests can inject faults. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dkv_internal.h"

/* ---- fault injection: op 1 write, 2 fdatasync, 3 dir fsync ---- */
static int fault_nth[4], fault_err[4], fault_pause_ms[4];
static int fault_armed;     /* any fault_nth > 0: the hot path skips the lock otherwise */
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
#define FAULT_PAUSE (-2)    /* fault_err's value for a pause (dkv_fault_pause) */

int dkv_fault_inject(int op, int nth, int err)
{
    if (op < 1 || op > 3 || nth < 0)
        return DKV_EINVAL;
    pthread_mutex_lock(&fault_mu);
    fault_nth[op] = nth;
    fault_err[op] = err ? err : EIO;
    __atomic_store_n(&fault_armed, fault_nth[1] > 0 || fault_nth[2] > 0 || fault_nth[3] > 0,
                     __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fault_mu);
    return 0;
}

int dkv_fault_pause(int op, int nth, int ms)
{
    if (op < 1 || op > 3 || ms < 0)
        return DKV_EINVAL;
    pthread_mutex_lock(&fault_mu);
    fault_pause_ms[op] = ms;        /* before the fault is armed: its hit reads it */
    pthread_mutex_unlock(&fault_mu);
    return dkv_fault_inject(op, nth, FAULT_PAUSE);
}

/* 0, or the errno to fail this call with. */
static int fault_hit(int op)
{
    int e = 0, ms = 0;
    if (!__atomic_load_n(&fault_armed, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&fault_mu);
    if (fault_nth[op] > 0 && --fault_nth[op] == 0)
        e = fault_err[op], ms = fault_pause_ms[op];
    pthread_mutex_unlock(&fault_mu);
    if (e == DKV_FAULT_KILL)    /* the process dies before the call, as under kill -9 */
        kill(getpid(), SIGKILL);
    if (e == FAULT_PAUSE) {     /* a slow disk: the call runs, late */
        struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) && errno == EINTR)
            ;
        e = 0;
    }
    return e;
}

int dkv__pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    int e = fault_hit(1);
    if (e)
        return -e;
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        off += (uint64_t)w;
        len -= (size_t)w;
    }
    return 0;
}

static uint64_t fdatasyncs;     /* successful fdatasyncs in this process (atomic) */

uint64_t dkv_fdatasync_count(void) { return __atomic_load_n(&fdatasyncs, __ATOMIC_RELAXED); }

int dkv__fdatasync(int fd)
{
    int e = fault_hit(2);
    if (e)
        return -e;
    if (fdatasync(fd))
        return -errno;
    __atomic_add_fetch(&fdatasyncs, 1, __ATOMIC_RELAXED);
    return 0;
}

int dkv__dirfsync(const char *dir)
{
    int e = fault_hit(3);
    if (e)
        return -e;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

int dkv__pread_all(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (int)got;
}

int dkv__read_file(int fd, uint8_t **out, uint64_t *size)
{
    struct stat st;
    if (fstat(fd, &st))
        return -errno;
    uint64_t n = (uint64_t)st.st_size;
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return -ENOMEM;
    uint64_t got = 0;
    while (got < n) {   /* in chunks: pread_all returns int */
        size_t chunk = n - got > (1u << 30) ? (1u << 30) : (size_t)(n - got);
        int r = dkv__pread_all(fd, b + got, chunk, got);
        if (r < 0) {
            free(b);
            return r;
        }
        if (r == 0)
            break;
        got += (uint64_t)r;
    }
    *out = b;
    *size = got;
    return 0;
}

/* ---- headers ---- */
void dkv__header_encode(const seg_header *h, uint8_t out[HDR_LEN])
{
    memset(out, 0, HDR_LEN);
    memcpy(out, SEG_MAGIC, 8);
    put16(out + 8, FORMAT_VERSION);
    put16(out + 10, HDR_LEN);
    put32(out + 12, h->flags);
    memcpy(out + 16, h->uuid, 16);
    put64(out + 32, h->segment_no);
    put64(out + 40, h->base_lsn);
    put64(out + 48, h->start_lsn);
    put32(out + 56, h->prev_digest);
    put32(out + 60, dkv_crc32c(0, out, 60));
}

int dkv__header_decode(const uint8_t *b, size_t avail, seg_header *h, const char **why)
{
    const char *w = NULL;
    if (avail < HDR_LEN)
        w = "segment shorter than its 64-byte header";
    else if (memcmp(b, SEG_MAGIC, 8))
        w = "bad segment magic";
    else if (get32(b + 60) != dkv_crc32c(0, b, 60))
        w = "header checksum mismatch";
    else if (get16(b + 8) != FORMAT_VERSION)
        w = "unsupported format version";
    else if (get16(b + 10) != HDR_LEN)
        w = "bad header_len";
    else if (get32(b + 12) & ~SEG_FLAGS_KNOWN)
        w = "unknown header flags";
    if (w) {
        if (why)
            *why = w;
        return DKV_DAMAGE_BAD_HEADER;
    }
    memcpy(h->uuid, b + 16, 16);
    h->segment_no = get64(b + 32);
    h->base_lsn = get64(b + 40);
    h->start_lsn = get64(b + 48);
    h->prev_digest = get32(b + 56);
    h->flags = get32(b + 12);
    return 0;
}

uint32_t dkv__seed(const uint8_t uuid[16], uint64_t segment_no)
{
    uint8_t b[24];
    memcpy(b, uuid, 16);
    put64(b + 16, segment_no);
    return dkv_crc32c(0, b, 24);
}

int dkv__trailer_decode(const uint8_t *t, uint64_t file_size, uint64_t base_lsn, seg_trailer *o)
{
    if (memcmp(t, SEAL_MAGIC, 8))
        return -1;
    o->count = get64(t + 8);
    o->first_lsn = get64(t + 16);
    o->last_lsn = get64(t + 24);
    o->data_end = get64(t + 32);
    o->digest = get32(t + 40);
    o->crc = get32(t + 44);
    /* An empty segment is never sealed, so count >= 1. */
    if (o->count == 0 || o->count > file_size / FRAME_HDR || o->first_lsn != base_lsn ||
        o->last_lsn != o->first_lsn + o->count - 1 || o->data_end < HDR_LEN ||
        o->data_end + o->count * 8 + TRAILER_LEN != file_size)
        return -2;
    return 0;
}

uint32_t dkv__trailer_crc(uint32_t seed, const uint8_t *index, uint64_t count, const uint8_t *t)
{
    uint32_t c = dkv_crc32c(seed, index, (size_t)count * 8);
    return dkv_crc32c(c, t, 44);
}

/* ---- frames ---- */
static uint32_t sync_gap(uint64_t lsn, uint64_t durable)
{
    uint64_t gap = durable <= lsn ? lsn - durable : 0;
    return gap >= SYNC_GAP_UNKNOWN ? SYNC_GAP_UNKNOWN : (uint32_t)gap;
}

void dkv__frame_fields(uint8_t h[FRAME_HDR], uint64_t lsn, uint8_t type, uint32_t len,
                       uint64_t durable)
{
    put32(h, 0);
    put32(h + 4, len);
    put64(h + 8, lsn);
    h[16] = type;
    h[17] = 0;
    h[18] = h[19] = 0;
    put32(h + 20, sync_gap(lsn, durable));
}

void dkv__frame_header(uint8_t h[FRAME_HDR], uint32_t seed, uint64_t lsn, uint8_t type,
                       const uint8_t *payload, uint32_t len, uint64_t durable)
{
    dkv__frame_fields(h, lsn, type, len, durable);
    uint32_t c = dkv_crc32c(seed, h + 4, FRAME_HDR - 4);
    put32(h, dkv_crc32c(c, payload, len));
}

void dkv__frames_restamp(uint8_t *buf, size_t n, uint32_t seed, uint64_t durable)
{
    for (size_t o = 0; o + FRAME_HDR <= n;) {
        uint8_t *h = buf + o;
        uint32_t len = get32(h + 4);
        uint32_t gap = sync_gap(get64(h + 8), durable);
        if (gap < get32(h + 20)) {
            put32(h + 20, gap);
            uint32_t c = dkv_crc32c(seed, h + 4, FRAME_HDR - 4);
            put32(h, dkv_crc32c(c, h + FRAME_HDR, len));
        }
        o += (size_t)FRAME_HDR + len;
    }
}

/* The durable watermark a valid frame header records (0 when unknown: saturated/invalid). */
static uint64_t frame_durable(const uint8_t *h)
{
    uint64_t lsn = get64(h + 8);
    uint32_t gap = get32(h + 20);
    if (gap == SYNC_GAP_UNKNOWN || gap > lsn)
        return 0;                   /* unknown: the conservative (smallest) watermark */
    return lsn - gap;
}

/* check_crc 0: structural checks only (the caller has verified the bytes otherwise). */
static int frame_check(const uint8_t *b, size_t avail, uint32_t seed, uint64_t expect,
                       uint64_t min_lsn, uint32_t *len, uint64_t *lsn, uint8_t *type,
                       int check_crc)
{
    if (avail < FRAME_HDR)
        return DKV_DAMAGE_TORN_TAIL;
    uint32_t l = get32(b + 4);
    uint64_t n = get64(b + 8);
    *len = l;
    *lsn = n;
    *type = b[16];
    /* Header fields are checked before the checksum so that garbage with a huge len
     * costs nothing, but a failure is still reported as a checksum mismatch when the
     * crc disagrees: a flipped bit anywhere is "checksum_mismatch", a well-formed frame
     * with a wrong LSN or type is "bad_header"/"lsn_gap". */
    int shape_ok = l <= MAX_FRAME_LEN && (uint64_t)l <= avail - FRAME_HDR;
    if (!shape_ok)
        return l > MAX_FRAME_LEN ? DKV_DAMAGE_BAD_HEADER : DKV_DAMAGE_TORN_TAIL;
    if (check_crc) {
        uint32_t c = dkv_crc32c(seed, b + 4, FRAME_HDR - 4);
        c = dkv_crc32c(c, b + FRAME_HDR, l);
        if (c != get32(b))
            return DKV_DAMAGE_CHECKSUM;
    }
    if ((b[16] != DKV_FRAME_DATA && b[16] != DKV_FRAME_COMMIT) || (b[17] & ~1u) || get16(b + 18))
        return DKV_DAMAGE_BAD_HEADER;
    if (expect != NO_LSN ? n != expect : n < min_lsn)
        return DKV_DAMAGE_LSN_GAP;
    return 0;
}

int dkv__frame_check(const uint8_t *b, size_t avail, uint32_t seed, uint64_t expect,
                     uint64_t min_lsn, uint32_t *len, uint64_t *lsn, uint8_t *type)
{
    return frame_check(b, avail, seed, expect, min_lsn, len, lsn, type, 1);
}

/* Offset of the first valid frame (any LSN >= min_lsn) at or after `from`, or NO_LSN. */
static uint64_t resync(const uint8_t *buf, uint64_t end, uint64_t from, uint32_t seed,
                     uint64_t min_lsn)
{
    for (uint64_t o = from; o + FRAME_HDR <= end; o++) {
        const uint8_t *b = buf + o;
        /* Cheap filters first: a plausible LSN, type, flags, reserved and length. */
        uint64_t n = get64(b + 8);
        uint32_t l = get32(b + 4);
        if (n < min_lsn || n - min_lsn > (end - o) || (b[16] != 1 && b[16] != 2) || (b[17] & ~1u) ||
            b[18] || b[19] || (uint64_t)l > end - o - FRAME_HDR)
            continue;
        uint32_t len8;
        uint64_t lsn;
        uint8_t type;
        if (dkv__frame_check(b, end - o, seed, NO_LSN, min_lsn, &len8, &lsn, &type) == 0)
            return o;
    }
    return NO_LSN;
}

/* FORMAT.md §6: is the bad frame expected at LSN k (valid frames resume at `from`)
 * proven synced by a later valid frame, i.e. one whose durable watermark exceeds k? */
static int synced_before_later_frame(const uint8_t *buf, uint64_t end, uint64_t from,
                                     uint32_t seed, uint64_t k)
{
    while (from != NO_LSN) {
        const uint8_t *b = buf + from;
        if (frame_durable(b) > k)
            return 1;
        from = resync(buf, end, from + FRAME_HDR + get32(b + 4), seed, k);
    }
    return 0;
}

int dkv__scan(const uint8_t *buf, uint64_t off, uint64_t end, uint32_t seed, uint64_t lsn,
              uint64_t **offs, size_t *n, size_t *cap, scan_result *res)
{
    return dkv__scan_ex(buf, off, end, seed, lsn, offs, n, cap, res, 1, 1);
}

int dkv__all_zero(const uint8_t *b, uint64_t n)
{
    /* word at a time: a 1 MiB slack is checked at memory speed */
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (get64(b + i))
            return 0;
    for (; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

int dkv__scan_ex(const uint8_t *buf, uint64_t off, uint64_t end, uint32_t seed, uint64_t lsn,
                 uint64_t **offs, size_t *n, size_t *cap, scan_result *res, int check_crc,
                 int zero_slack)
{
    memset(res, 0, sizeof *res);
    res->resync_off = NO_LSN;
    while (off < end) {
        uint32_t len;
        uint64_t flsn;
        uint8_t type;
        int k = frame_check(buf + off, end - off, seed, lsn, 0, &len, &flsn, &type, check_crc);
        if (k && zero_slack && dkv__all_zero(buf + off, end - off))
            break;      /* the active segment's zero slack: the clean end of data (§3) */
        if (k) {
            res->kind = k;
            res->bad_off = off;
            res->resync_off = resync(buf, end, off + 1, seed, lsn);
            /* Torn unless a later valid frame was written after this one was synced: valid
             * frames after a hole in the unsynced end are themselves unsynced (power loss). */
            res->torn = !synced_before_later_frame(buf, end, res->resync_off, seed, lsn);
            /* A frame running past the end is only "incomplete" when nothing valid follows. */
            if (res->resync_off != NO_LSN && k == DKV_DAMAGE_TORN_TAIL)
                res->kind = DKV_DAMAGE_CHECKSUM;
            break;
        }
        if (offs) {
            if (DKV_RESERVE(*offs, *cap, *n + 1, 1024))
                return DKV_ENOMEM;
            (*offs)[(*n)++] = off;
        }
        off += FRAME_HDR + len;
        lsn++;
    }
    res->end = off;
    res->next_lsn = lsn;
    return 0;
}

/* ---- directory ---- */
void dkv__seg_name(char out[64], uint64_t base)
{
    snprintf(out, 64, "%016llx.seg", (unsigned long long)base);
}

int dkv__seg_path(char out[DKV_PATH_MAX], const char *dir, uint64_t base)
{
    char name[64];
    dkv__seg_name(name, base);
    return dkv__path(out, dir, "%s", name);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int dkv__list_segments(const char *dir, uint64_t **bases, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    size_t cnt = 0, cap = 0;
    uint64_t *v = NULL;
    struct dirent *e;
    int rc = DKV_RESERVE(v, cap, 16, 16);
    while (!rc && (e = readdir(d))) {
        const char *s = e->d_name;
        if (strlen(s) != 20 || strcmp(s + 16, ".seg"))
            continue;
        char *endp;
        char hex[17];
        memcpy(hex, s, 16);
        hex[16] = 0;
        unsigned long long b = strtoull(hex, &endp, 16);
        if (*endp)
            continue;
        if (!(rc = DKV_RESERVE(v, cap, cnt + 1, 16)))
            v[cnt++] = b;
    }
    closedir(d);
    if (rc) {
        free(v);
        return -ENOMEM;
    }
    qsort(v, cnt, sizeof *v, cmp_u64);
    *bases = v;
    *n = cnt;
    return 0;
}

int dkv__mkdir_fsync(const char *dir, const char *sub)
{
    char p[DKV_PATH_MAX];
    if (dkv__path(p, dir, "%s", sub))
        return -errno;
    if (mkdir(p, 0755) == 0)
        return dkv__dirfsync(dir);
    return errno == EEXIST ? 0 : -errno;
}

int dkv__random_bytes(uint8_t *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    return 0;
}

void dkv_report_free(dkv_report *r)
{
    if (!r)
        return;
    free(r->segments);
    free(r->damage);
    free(r);
}

void dkv_free(void *p) { free(p); }

const char *dkv_strerror(int code)
{
    switch (code) {
    case DKV_OK: return "ok";
    case DKV_EIO: return "I/O error";
    case DKV_ECORRUPT: return "corruption";
    case DKV_ELOCKED: return "store is locked";
    case DKV_EFAILED: return "log failed after an earlier I/O error";
    case DKV_EINVAL: return "invalid argument";
    case DKV_ENOENT: return "no log at that path";
    case DKV_EREADONLY: return "read-only handle";
    case DKV_ENOMEM: return "out of memory";
    case DKV_ECLOSED: return "handle is closed";
    case DKV_ESTALE: return "the log was repaired since this read-only handle opened it";
    case DKV_ETOOBIG: return "frame too large";
    case DKV_ENOLSN: return "no such lsn";
    case DKV_EFORKED: return "the handle was opened by another process (this one is a fork)";
    case DKV_MOVED: return "the log moved past the caller's view (nothing appended)";
    case DKV_WOULD_WAIT: return "the call would wait (nothing done)";
    default: return "unknown error";
    }
}

const char *dkv_damage_name(int kind)
{
    static const char *names[] = {"none", "checksum_mismatch", "bad_header", "torn_tail",
                                  "lsn_gap", "missing_segment", "foreign_segment", "bad_seal",
                                  "broken_chain"};
    return kind >= 0 && kind <= 8 ? names[kind] : "unknown";
}
