/* Internal helpers shared by the C files of the segment log. Not part of the API. */
#ifndef DKV_INTERNAL_H
#define DKV_INTERNAL_H

#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "seglog.h"

#define HDR_LEN 64
/* Offsets of the segment header's chain fields (FORMAT.md §2): damage names them. */
#define HDR_OFF_UUID 16
#define HDR_OFF_SEGMENT_NO 32
#define HDR_OFF_BASE_LSN 40
#define HDR_OFF_PREV_DIGEST 56
#define FRAME_HDR 24
#define FORMAT_VERSION 1
#define SYNC_GAP_UNKNOWN 0xFFFFFFFFu   /* saturated sync_gap: durable watermark unknown */
#define TRAILER_LEN 48
#define MAX_FRAME_LEN ((1u << 30) - 1)
#define SEG_MAGIC "DKVSEG\x00\x01"
#define SEAL_MAGIC "DKVSEAL\x01"
#define NO_LSN UINT64_MAX

static inline uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- growing arrays and store paths (util.c) ---- */
/* Room for `need` elements of `size` bytes in the array v of capacity *cap: v itself when
 * they fit, else v realloc'd to a capacity doubled (from `first`) until they do, with *cap
 * set. NULL when memory runs out (v is still the caller's, *cap unchanged). */
void *dkv__grow(void *v, size_t *cap, size_t need, size_t size, size_t first);
/* dkv__grow on the array lvalue v and its size_t capacity cap, assigning v: 0 or
 * DKV_ENOMEM. Every growing array of the log goes through it. */
#define DKV_RESERVE(v, cap, need, first)                                        \
    __extension__({                                                             \
        void *grown_ = dkv__grow((v), &(cap), (need), sizeof *(v), (first));    \
        if (grown_)                                                             \
            (v) = grown_;                                                       \
        grown_ ? 0 : DKV_ENOMEM;                                                \
    })
/* A path in the store directory: longer ones are ENAMETOOLONG to the kernel anyway. */
#define DKV_PATH_MAX PATH_MAX
/* out = dir "/" fmt(...): 0, or -1 with errno ENAMETOOLONG when it does not fit in
 * DKV_PATH_MAX (out holds the cut text, for messages). The caller reports it exactly as
 * the open(2), rename(2) or unlink(2) it was built for: `dkv__path(...) ? -1 : open(...)`. */
int dkv__path(char out[DKV_PATH_MAX], const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Three independent crc32c(seed[i], p[i], len[i]) computed interleaved (crc32c.c). */
void dkv__crc32c_x3(const uint32_t seed[3], const uint8_t *const p[3], const size_t len[3],
                    uint32_t out[3]);

/* crc32c(s, X) == dkv__crc32c_mult(dkv__crc32c_op(len X), s) ^ crc32c(0, X): the seed's
 * contribution is linear, which lets a crc be moved past bytes without reading them. */
uint32_t dkv__crc32c_op(uint64_t len);
uint32_t dkv__crc32c_mult(uint32_t a, uint32_t b);

/* ---- I/O through the fault table (format.c) ---- */
int dkv__pwrite_all(int fd, const void *buf, size_t len, uint64_t off);   /* 0 or -errno */
int dkv__fdatasync(int fd);                                               /* 0 or -errno */
int dkv__dirfsync(const char *dir);                                       /* 0 or -errno */
int dkv__pread_all(int fd, void *buf, size_t len, uint64_t off);          /* bytes read or -errno */
/* Read a whole file into a malloc'd buffer (size bytes from offset 0). */
int dkv__read_file(int fd, uint8_t **out, uint64_t *size);

/* ---- segment header / trailer / frames (format.c) ---- */
typedef struct {
    uint8_t uuid[16];
    uint64_t segment_no, base_lsn, start_lsn;
    uint32_t prev_digest;
    uint32_t flags;         /* SEG_FLAG_* */
} seg_header;

/* Segment header flags (FORMAT.md §2). STEP_IDS: journal heads in the segment may hold
 * compact step ids (§5a); every segment this version creates carries it. */
#define SEG_FLAG_STEP_IDS 1u
#define SEG_FLAGS_KNOWN SEG_FLAG_STEP_IDS
#define SEG_FLAGS_NEW SEG_FLAG_STEP_IDS

typedef struct {
    uint64_t count, first_lsn, last_lsn, data_end;
    uint32_t digest, crc;
} seg_trailer;

void dkv__header_encode(const seg_header *h, uint8_t out[HDR_LEN]);
/* 0 if valid, else DKV_DAMAGE_BAD_HEADER (detail names the field). */
int dkv__header_decode(const uint8_t *b, size_t avail, seg_header *h, const char **why);
uint32_t dkv__seed(const uint8_t uuid[16], uint64_t segment_no);
/* Parse the last 48 bytes; 0 if the magic is there and fields are self-consistent with size. */
int dkv__trailer_decode(const uint8_t *t, uint64_t file_size, uint64_t base_lsn, seg_trailer *out);
/* crc of index || trailer[0..44] */
uint32_t dkv__trailer_crc(uint32_t seed, const uint8_t *index, uint64_t count, const uint8_t *t);
/* durable: the log's durable watermark D when the frame is encoded (every frame below it
 * was fdatasync'd); stored as sync_gap = min(lsn - D, 0xFFFFFFFF). */
void dkv__frame_header(uint8_t h[FRAME_HDR], uint32_t seed, uint64_t lsn, uint8_t type,
                       const uint8_t *payload, uint32_t len, uint64_t durable);
/* dkv__frame_header without the crc (left 0): for frames whose crc is computed later,
 * when the payload follows the header in memory (crc32c(seed, h + 4, 20 + len)). */
void dkv__frame_fields(uint8_t h[FRAME_HDR], uint64_t lsn, uint8_t type, uint32_t len,
                       uint64_t durable);
/* Record `durable` in every frame of the encoded run buf[0..n) whose watermark is older,
 * re-sealing its crc: called just before the run is handed to write(2). */
void dkv__frames_restamp(uint8_t *buf, size_t n, uint32_t seed, uint64_t durable);
/* Check one frame at b (avail bytes follow). expect: LSN it must carry, or NO_LSN for any
 * LSN >= min_lsn. Returns 0 or a damage kind; fills len/lsn/type when the header parses. */
int dkv__frame_check(const uint8_t *b, size_t avail, uint32_t seed, uint64_t expect,
                     uint64_t min_lsn, uint32_t *len, uint64_t *lsn, uint8_t *type);

/* Scan frames of one segment held in memory, from `off` up to `end`. Appends every good
 * frame's offset to *offs (growing it). Stops at the first bad frame: result says where,
 * what kind, and whether it is a torn tail (FORMAT.md §6: no later valid frame
 * records a durable watermark above the bad frame's LSN). `resync_off` is the first valid
 * frame after it, torn or not (salvage resyncs there). */
typedef struct {
    uint64_t end;           /* offset after the last good frame */
    uint64_t next_lsn;      /* LSN after the last good frame */
    int kind;               /* DKV_DAMAGE_NONE if the scan reached `end` cleanly */
    uint64_t bad_off;
    int torn;               /* active segment: the bad bytes are an unsynced (torn) tail */
    uint64_t resync_off;    /* where a valid frame starts again (NO_LSN if none) */
} scan_result;
int dkv__scan(const uint8_t *buf, uint64_t off, uint64_t end, uint32_t seed, uint64_t lsn,
              uint64_t **offs, size_t *n, size_t *cap, scan_result *res);
/* dkv__scan with check_crc 0: structural checks only (header fields, lengths, LSN
 * continuity), for bytes already proven intact by a matching segment_digest. zero_slack 1
 * (the active segment; dkv__scan's default): bytes from a bad frame header to `end` that
 * are all zero are the clean end of data, not damage (FORMAT.md §3); 0 for the frames of
 * a sealed segment, where the trailer says where they end. */
int dkv__scan_ex(const uint8_t *buf, uint64_t off, uint64_t end, uint32_t seed, uint64_t lsn,
                 uint64_t **offs, size_t *n, size_t *cap, scan_result *res, int check_crc,
                 int zero_slack);
/* 1 if the n bytes at b are all zero. */
int dkv__all_zero(const uint8_t *b, uint64_t n);

/* Sorted list of segment base LSNs in dir (files named %016llx.seg). ENOENT if no dir. */
int dkv__list_segments(const char *dir, uint64_t **bases, size_t *n);
void dkv__seg_name(char out[64], uint64_t base);
/* dkv__path of segment file `base` in dir. */
int dkv__seg_path(char out[DKV_PATH_MAX], const char *dir, uint64_t base);
int dkv__mkdir_fsync(const char *dir, const char *sub);   /* mkdir dir/sub + fsync dir */
int dkv__random_bytes(uint8_t *out, size_t n);

/* ---- HEAD (head.c, FORMAT.md §2a) ---- */
#define HEAD_LEN 64
typedef struct {
    uint8_t uuid[16];
    uint64_t segment_no, base_lsn, epoch;
} log_head;
/* 0 and *h; DKV_ENOENT if there is no HEAD; DKV_ECORRUPT (why says what) if it does not
 * verify; DKV_EIO if it cannot be read. */
int dkv__head_read(const char *dir, log_head *h, const char **why);
/* (damage.c) HEAD (as read) against the log's uuid (NULL: unknown) and its newest segment file
 * (have_segments 0: none): DKV_DAMAGE_FOREIGN or DKV_DAMAGE_MISSING (HEAD names a newer
 * segment: the newest files are gone) with where (name, off) and why, else NONE. */
int dkv__check_head(const log_head *hd, const uint8_t *uuid, int have_segments,
                    uint64_t newest_base, char name[64], uint64_t *off, char *detail, size_t cap);

/* Replace HEAD atomically (HEAD.tmp, fdatasync, rename, directory fsync). 0 or -errno. */
int dkv__head_write(const char *dir, const log_head *h);

/* ---- handle internals used by commit.c ---- */
/* The handle's error message (log NULL: the calling thread's, for the calls without a
 * handle, dkv_verify and dkv_recover), with no errno behind it. */
void dkv__set_error(dkv_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An I/O failure: the message gets ": strerror(err)" and err is kept for dkv_last_errno.
 * Returns DKV_EIO. */
int dkv__io_error(dkv_log *log, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- damage (damage.c): one classifier, one record, one quarantine ---- */
/* A segment header that does not decode: DKV_DAMAGE_TORN_TAIL for the newest segment cut
 * off within its header (size <= HDR_LEN), else DKV_DAMAGE_BAD_HEADER. */
int dkv__classify_header(int is_last, uint64_t size);
/* The first bad frame a scan found (res->kind != 0): DKV_DAMAGE_TORN_TAIL in an active
 * segment when no later valid frame vouches for it (FORMAT.md §6), else the
 * corruption kind. resync_is_data: salvage, which reads on at the next valid frame, so a
 * hole followed by valid frames is corruption. detail (cap bytes) gets the lsn and why. */
int dkv__classify_frame(const scan_result *res, int sealed, int resync_is_data, char *detail,
                        size_t cap);

/* What the previous segment fixes about the next (the chain, FORMAT.md §2 and §4). */
typedef struct {
    const uint8_t *uuid;    /* the log's uuid; NULL: not known yet, any */
    int known;              /* 0: no previous segment to check against */
    uint64_t segment_no, base_lsn;
    int next_known;         /* next_lsn is where the next segment must start */
    uint64_t next_lsn;      /*   (else it only has to start above base_lsn) */
    int digest_known;       /* digest: the previous segment's segment_digest */
    uint32_t digest;
} seg_link;
/* Header h of the file named for `base` against the file name and the previous segment:
 * DKV_DAMAGE_NONE, or the kind with the offending field's offset and a detail. */
int dkv__check_link(const seg_header *h, uint64_t base, const seg_link *prev, uint64_t *off,
                    char *detail, size_t cap);

/* One disagreement between a sealed segment's trailer/index and its frames. */
typedef struct {
    int kind;
    uint64_t off, lsn;
    const char *why;
} seal_finding;
#define TRAILER_CRC_WHY "trailer checksum mismatch"
#define NO_TRAILER_WHY "sealed segment has no valid trailer"
/* A sealed segment (bytes b[0..size), trailer t whose crc verified) whose frame scan was
 * clean, finding n frames at offs: frame_count, index entries, then segment_digest
 * (digest_ok: it matched). Fills out[] in that order, returns how many. */
size_t dkv__check_seal(const uint8_t *b, uint64_t size, const seg_trailer *t, uint64_t base,
                       const uint64_t *offs, uint64_t n, int digest_ok, seal_finding out[3]);

/* Append a filled record to r->damage. 0 or DKV_ENOMEM. */
int dkv__report_add_damage(dkv_report *r, const char *seg, uint64_t off, int kind,
                           uint64_t lost_first, uint64_t lost_last, const char *detail);

/* Move segment file `name` whole to quarantine/<name>.0.torn (rename, fsync both dirs). */
int dkv__quarantine_whole(const char *dir, const char *name);
/* Copy bytes [off, size) of segment `name` (open as fd, its bytes in buf) to quarantine/,
 * then truncate the file at off and fdatasync it. 0 or -errno. */
int dkv__quarantine_tail(const char *dir, const char *name, int fd, const uint8_t *buf,
                         uint64_t size, uint64_t off);

#endif
