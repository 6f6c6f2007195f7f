/* Damage: the one place that decides what a finding is (a torn tail or corruption, which
 * link of the segment chain broke, which part of a seal disagrees), the one place that
 * fills a damage record, and the one place that moves damaged bytes to quarantine/.
 * open (every recovery mode), verify and recover all call these, so the same bytes get the
 * same kind, offset and words whichever path finds them (FORMAT.md §2 and §4: the chain
 * and the seal; §6: torn tail or corruption; §1 and §6: quarantine/). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log_int.h"

/* ---- deciding ---- */

int dkv__classify_header(int is_last, uint64_t size)
{
    /* the newest segment cut off within its header never got going: a torn tail */
    return is_last && size <= HDR_LEN ? DKV_DAMAGE_TORN_TAIL : DKV_DAMAGE_BAD_HEADER;
}

int dkv__classify_frame(const scan_result *res, int sealed, int resync_is_data, char *detail,
                        size_t cap)
{
    /* Torn only at the end of the active segment, and only when no later valid frame vouches
     * for the bad one (FORMAT.md §6). Salvage reads on at the next valid frame, so
     * for it valid frames after the hole are data, and the hole is corruption. */
    int torn = !sealed && res->torn && !(resync_is_data && res->resync_off != NO_LSN);
    const char *why =
        sealed ? "bad frame in a sealed segment"
        : !torn && res->torn ? "bad frame followed by valid (unsynced) frames"
        : !torn ? "bad frame that a later valid frame shows was synced"
        : res->resync_off == NO_LSN ? "incomplete frame at the end of the active segment"
        : "unsynced tail of the active segment with holes (no later frame vouches for it)";
    snprintf(detail, cap, "frame of lsn %llu: %s", (unsigned long long)res->next_lsn, why);
    if (torn)
        return DKV_DAMAGE_TORN_TAIL;
    /* a frame running past the end of a region that must be whole is not a tail */
    return res->kind == DKV_DAMAGE_TORN_TAIL ? DKV_DAMAGE_CHECKSUM : res->kind;
}

int dkv__check_link(const seg_header *h, uint64_t base, const seg_link *prev, uint64_t *off,
                    char *detail, size_t cap)
{
    if (h->base_lsn != base) {
        *off = HDR_OFF_BASE_LSN;
        snprintf(detail, cap, "header base_lsn %llu does not match the file name",
                 (unsigned long long)h->base_lsn);
        return DKV_DAMAGE_BAD_HEADER;
    }
    if (prev->uuid && memcmp(h->uuid, prev->uuid, 16)) {
        *off = HDR_OFF_UUID;
        snprintf(detail, cap, "segment belongs to another log (uuid differs)");
        return DKV_DAMAGE_FOREIGN;
    }
    if (!prev->known)
        return DKV_DAMAGE_NONE;
    if (h->segment_no != prev->segment_no + 1 ||
        (prev->next_known ? base != prev->next_lsn : base <= prev->base_lsn)) {
        *off = HDR_OFF_SEGMENT_NO;
        snprintf(detail, cap, "expected segment_no %llu %s lsn %llu, found segment_no %llu at lsn %llu",
                 (unsigned long long)prev->segment_no + 1, prev->next_known ? "at" : "after",
                 (unsigned long long)(prev->next_known ? prev->next_lsn : prev->base_lsn),
                 (unsigned long long)h->segment_no, (unsigned long long)base);
        return DKV_DAMAGE_MISSING;
    }
    if (prev->digest_known && h->prev_digest != prev->digest) {
        *off = HDR_OFF_PREV_DIGEST;
        snprintf(detail, cap, "prev_digest does not match the previous segment");
        return DKV_DAMAGE_FOREIGN;
    }
    return DKV_DAMAGE_NONE;
}

size_t dkv__check_seal(const uint8_t *b, uint64_t size, const seg_trailer *t, uint64_t base,
                       const uint64_t *offs, uint64_t n, int digest_ok, seal_finding out[3])
{
    size_t k = 0;
    if (n != t->count)
        out[k++] = (seal_finding){DKV_DAMAGE_BAD_SEAL, size - TRAILER_LEN + 8, base + n,
                                  "trailer frame_count differs from the frames found"};
    for (uint64_t i = 0; i < n && i < t->count; i++)
        if (get64(b + t->data_end + i * 8) != offs[i]) {
            out[k++] = (seal_finding){DKV_DAMAGE_BAD_SEAL, t->data_end + i * 8, base + i,
                                      "index entry differs from the frame's offset"};
            break;
        }
    if (!digest_ok)
        out[k++] = (seal_finding){DKV_DAMAGE_BAD_SEAL, size - 8, base, "segment_digest mismatch"};
    return k;
}

int dkv__check_head(const log_head *hd, const uint8_t *uuid, int have_segments,
                    uint64_t newest_base, char name[64], uint64_t *off, char *detail, size_t cap)
{
    if (uuid && memcmp(hd->uuid, uuid, 16)) {
        snprintf(name, 64, "HEAD");
        *off = 16;
        snprintf(detail, cap, "HEAD belongs to another log (uuid differs)");
        return DKV_DAMAGE_FOREIGN;
    }
    if (have_segments && hd->base_lsn <= newest_base)
        return DKV_DAMAGE_NONE;
    dkv__seg_name(name, hd->base_lsn);
    *off = 0;
    snprintf(detail, cap, "HEAD names segment_no %llu at lsn %llu as the newest: the newest "
             "segments are missing", (unsigned long long)hd->segment_no,
             (unsigned long long)hd->base_lsn);
    return DKV_DAMAGE_MISSING;
}

/* ---- recording ---- */

static void damage_fill(dkv_damage *d, const char *seg, uint64_t off, int kind,
                        uint64_t lost_first, uint64_t lost_last, const char *detail)
{
    memset(d, 0, sizeof *d);
    snprintf(d->segment, sizeof d->segment, "%s", seg);
    d->offset = off;
    d->kind = kind;
    d->lost_first_lsn = lost_first;
    d->lost_last_lsn = lost_last;
    snprintf(d->detail, sizeof d->detail, "%s", detail ? detail : "");
}

int dkv__damage_record(dkv_log *log, const char *seg, uint64_t off, int kind,
                       uint64_t lost_first, uint64_t lost_last, const char *detail)
{
    damage_fill(&log->damage, seg, off, kind, lost_first, lost_last, detail);
    log->has_damage = 1;
    dkv__set_error(log, "segment %s offset %llu: %s (%s)", seg, (unsigned long long)off,
                   dkv_damage_name(kind), detail);
    return DKV_ECORRUPT;
}

void dkv__damage_read_past(dkv_log *log, const char *seg, uint64_t off, int kind,
                           uint64_t lost_first, uint64_t lost_last, const char *detail)
{
    if (!log->has_damage)
        dkv__damage_record(log, seg, off, kind, lost_first, lost_last, detail);
    log->err[0] = 0;
}

int dkv__report_add_damage(dkv_report *r, const char *seg, uint64_t off, int kind,
                           uint64_t lost_first, uint64_t lost_last, const char *detail)
{
    dkv_damage *d = realloc(r->damage, (r->n_damage + 1) * sizeof *d);
    if (!d)
        return DKV_ENOMEM;
    r->damage = d;
    damage_fill(&d[r->n_damage++], seg, off, kind, lost_first, lost_last, detail);
    return 0;
}

/* ---- quarantine (FORMAT.md §1: its names; §6: what recovery moves there) ---- */

/* Copy buf to quarantine/<seg>.<off>.torn (fsync file + quarantine dir). 0 or -errno. */
static int quarantine_copy(const char *dir, const char *seg, uint64_t off, const uint8_t *buf,
                           size_t n)
{
    int rc = dkv__mkdir_fsync(dir, "quarantine");
    if (rc)
        return rc;
    char q[DKV_PATH_MAX], p[DKV_PATH_MAX];
    if (dkv__path(q, dir, "quarantine"))
        return -errno;
    int fd = -1;
    for (int i = 0; i < 1000 && fd < 0; i++) {
        int bad = i ? dkv__path(p, q, "%s.%llu.torn.%d", seg, (unsigned long long)off, i)
                    : dkv__path(p, q, "%s.%llu.torn", seg, (unsigned long long)off);
        fd = bad ? -1 : open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST)
            return -errno;
    }
    if (fd < 0)
        return -EEXIST;
    rc = dkv__pwrite_all(fd, buf, n, 0);
    if (!rc)
        rc = dkv__fdatasync(fd);
    close(fd);
    if (rc)
        unlink(p);      /* a failed copy (a full disk) is no copy: leave no empty file */
    else
        rc = dkv__dirfsync(q);
    return rc;
}

int dkv__quarantine_whole(const char *dir, const char *name)
{
    int rc = dkv__mkdir_fsync(dir, "quarantine");
    if (rc)
        return rc;
    char from[DKV_PATH_MAX], q[DKV_PATH_MAX], to[DKV_PATH_MAX];
    if (dkv__path(from, dir, "%s", name) || dkv__path(q, dir, "quarantine"))
        return -errno;
    for (int i = 0; i < 1000; i++) {
        if (i ? dkv__path(to, q, "%s.0.torn.%d", name, i) : dkv__path(to, q, "%s.0.torn", name))
            return -errno;
        if (access(to, F_OK) == 0)
            continue;
        if (rename(from, to))
            return -errno;
        rc = dkv__dirfsync(q);
        return rc ? rc : dkv__dirfsync(dir);
    }
    return -EEXIST;
}

int dkv__quarantine_tail(const char *dir, const char *name, int fd, const uint8_t *buf,
                         uint64_t size, uint64_t off)
{
    if (off >= size)
        return 0;
    int rc = quarantine_copy(dir, name, off, buf + off, size - off);
    if (!rc)
        rc = ftruncate(fd, (off_t)off) ? -errno : dkv__fdatasync(fd);
    return rc;
}
