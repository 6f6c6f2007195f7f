/* CRC-32C (Castagnoli), RFC 3720: reflected polynomial 0x82F63B78, pre/post inversion.
 *
 * Three implementations with identical results, chosen at run time so one build runs on
 * any x86-64: PCLMULQDQ folding for buffers of 64 bytes and more, SSE4.2's crc32
 * instruction (8 bytes per instruction) for shorter ones or CPUs without PCLMULQDQ, and a
 * portable slicing-by-8 table walk for every other CPU. `seed` is a previous result,
 * so crc(crc(0, a), b) == crc(0, a || b) (docs/FORMAT.md, top).
 */
#include <pthread.h>
#include <string.h>

#include "dkv_internal.h"

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = table[0][n];
        for (int k = 1; k < 8; k++) {
            c = table[0][c & 0xff] ^ (c >> 8);
            table[k][n] = c;
        }
    }
}

uint32_t dkv_crc32c_portable(uint32_t seed, const uint8_t *p, size_t len)
{
    pthread_once(&table_once, table_init);
    uint32_t c = ~seed;
    /* Byte steps until 8-aligned, so the 8-byte loads below are aligned. */
    while (len && ((uintptr_t)p & 7)) {
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);          /* little-endian hosts only: the formats are LE anyway */
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
            table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
            table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

/* ---- combining: crc(A || B) from crc(A), crc(B) and len(B) (zlib's crc32_combine) ----
 * Polynomials over GF(2) in the reflected bit order of the CRC; x2n[k] = x^(2^k) mod P. */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static uint32_t x2n_table[32];
static pthread_once_t x2n_once = PTHREAD_ONCE_INIT;

static void x2n_init(void)
{
    uint32_t p = 1u << 30;          /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < 32; n++)
        x2n_table[n] = p = multmodp(p, p);
}

/* x^(n * 2^k) mod P */
static uint32_t x2nmodp(uint64_t n, unsigned k)
{
    uint32_t p = 1u << 31;          /* x^0 */
    while (n) {
        if (n & 1)
            p = multmodp(x2n_table[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

/* The operator that appends len2 bytes: crc(A||B) = multmodp(op, crc(A)) ^ crc(0, B). */
static uint32_t combine_op(uint64_t len2)
{
    pthread_once(&x2n_once, x2n_init);
    return x2nmodp(len2, 3);
}

uint32_t dkv__crc32c_op(uint64_t len) { return combine_op(len); }

/* multmodp without data-dependent branches (a is a full 32-bit operator here). */
uint32_t dkv__crc32c_mult(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (int i = 0; i < 32; i++) {
        p ^= b & (0u - (a >> 31));
        a <<= 1;
        b = (b >> 1) ^ (POLY & (0u - (b & 1)));
    }
    return p;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#include <wmmintrin.h>

__attribute__((target("sse4.2")))
static uint64_t crc32c_sse42_raw(uint64_t c, const uint8_t *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return c;
}

/* Buffers of 192 bytes and more: three independent crc32q streams over three adjacent
 * blocks (the crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle,
 * so one stream uses a third of it), joined by "shifting" a crc past a block: a linear map
 * done with four table lookups (Mark Adler's crc32c_shift; tables built once per block
 * size). The Intel/Linux-kernel technique; results are bit-identical to the single-stream
 * loop (tests/test_crc32c.py checks them against the portable table walk). */
#define N_BLK 3
static const size_t blk_len[N_BLK] = {8192, 256, 64};
static uint32_t shift_tab[N_BLK][4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

static void shift_init(void)
{
    for (int i = 0; i < N_BLK; i++) {
        uint32_t op = combine_op(blk_len[i]);
        for (int k = 0; k < 4; k++)
            for (uint32_t b = 0; b < 256; b++)
                shift_tab[i][k][b] = multmodp(op, b << (8 * k));
    }
}

/* multmodp(op(blk), c): c moved past blk zero bytes */
static inline uint32_t shift(const uint32_t t[4][256], uint32_t c)
{
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

/* Advance three crc32q streams over n bytes (a multiple of 8) of a, b and d at once: the
 * instruction has a latency of 3 and a throughput of 1, so three streams keep it busy. */
__attribute__((target("sse4.2")))
static inline void crc3_step(uint64_t *c0, uint64_t *c1, uint64_t *c2, const uint8_t *a,
                             const uint8_t *b, const uint8_t *d, size_t n)
{
    uint64_t x = *c0, y = *c1, z = *c2;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t va, vb, vd;
        memcpy(&va, a + i, 8);
        memcpy(&vb, b + i, 8);
        memcpy(&vd, d + i, 8);
        x = _mm_crc32_u64(x, va);
        y = _mm_crc32_u64(y, vb);
        z = _mm_crc32_u64(z, vd);
    }
    *c0 = x;
    *c1 = y;
    *c2 = z;
}

__attribute__((target("sse4.2")))
static uint64_t crc32c_3way(uint64_t c0, const uint8_t **pp, size_t *lenp, size_t blk,
                            const uint32_t t[4][256])
{
    const uint8_t *p = *pp;
    size_t len = *lenp;
    while (len >= 3 * blk) {
        uint64_t c1 = 0xffffffffu, c2 = 0xffffffffu;   /* crc(0, .) of blocks 2 and 3 */
        const uint8_t *a = p, *b = p + blk, *d = p + 2 * blk;
        crc3_step(&c0, &c1, &c2, a, b, d, blk);
        /* c0..c2 are raw states (complemented crcs): crc(A||B) = shift(crc(A)) ^ crc(0, B),
         * so in raw form raw(A||B) = shift(~rawA) ^ rawB. */
        uint32_t r = shift(t, ~(uint32_t)c0) ^ (uint32_t)c1;
        r = shift(t, ~r) ^ (uint32_t)c2;
        c0 = r;
        p += 3 * blk;
        len -= 3 * blk;
    }
    *pp = p;
    *lenp = len;
    return c0;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t seed, const uint8_t *p, size_t len)
{
    uint64_t c = ~seed;
    if (len >= 3 * blk_len[N_BLK - 1]) {
        pthread_once(&shift_once, shift_init);
        for (int i = 0; i < N_BLK; i++)
            c = crc32c_3way(c, &p, &len, blk_len[i], (const uint32_t (*)[256])shift_tab[i]);
    }
    return ~(uint32_t)crc32c_sse42_raw(c, p, len);
}

/* Three independent crcs at once (three frames of a batch): the instruction's latency is
 * hidden the same way as in crc32c_3way, with nothing to combine. */
__attribute__((target("sse4.2")))
static void crc32c_x3_sse42(const uint32_t seed[3], const uint8_t *const p[3],
                            const size_t len[3], uint32_t out[3])
{
    uint64_t c0 = ~seed[0], c1 = ~seed[1], c2 = ~seed[2];
    size_t m = len[0] < len[1] ? len[0] : len[1];
    m = (m < len[2] ? m : len[2]) & ~(size_t)7;
    const uint8_t *a = p[0], *b = p[1], *d = p[2];
    crc3_step(&c0, &c1, &c2, a, b, d, m);
    out[0] = ~(uint32_t)crc32c_sse42_raw(c0, a + m, len[0] - m);
    out[1] = ~(uint32_t)crc32c_sse42_raw(c1, b + m, len[1] - m);
    out[2] = ~(uint32_t)crc32c_sse42_raw(c2, d + m, len[2] - m);
}

/* Buffers of 64 bytes and more (len >= PCLMUL_MIN): carry-less multiplication
 * (PCLMULQDQ) folds 64 bytes at a time, four 16-byte lanes, and the crc32 instruction
 * reduces what is left. Where the crc32 instruction issues only every third cycle (this
 * project's AMD EPYC), the three streams above gain nothing over one, and this runs at
 * twice their speed (FORMAT.md, design notes).
 *
 * The math (reflected bit order: a 16-byte block loaded little-endian has the message's
 * first bit, the highest power, at bit 0). A block X = L x^64 + H followed by D bits is
 * X x^D = L x^(D+64) + H x^D (mod P). clmul of L (bit i: x^(63-i)) and a constant whose
 * bit j is x^(63-j) of k gives L k x in the block's own layout (bit m: x^(127-m)), so the
 * constants are k = x^(D+63) and x^(D-1) mod P, bit-reflected, in the high 32 bits
 * (tests/test_crc32c.py derives them again from the polynomial). What is folded is
 * congruent to the message read so far, so the crc32 instruction over the last block from
 * state 0 finishes the crc; the initial state is xored into the first four bytes. */
#define PCLMUL_MIN 64     /* the loop's first four blocks; from here on it is faster */

static const uint64_t fold512[2] = {0x1c19243b00000000ull, 0x75bba45b00000000ull};
static const uint64_t fold128[2] = {0x3743f7bd00000000ull, 0x3171d43000000000ull};

__attribute__((target("sse4.2,pclmul")))
static inline __m128i fold(__m128i x, __m128i k, __m128i next)
{
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00), hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

__attribute__((target("sse4.2,pclmul")))
static uint32_t crc32c_pclmul(uint32_t seed, const uint8_t *p, size_t len)
{
    const __m128i k4 = _mm_loadu_si128((const __m128i *)fold512);
    const __m128i k1 = _mm_loadu_si128((const __m128i *)fold128);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)~seed));
    p += 64;
    len -= 64;
    while (len >= 64) {
        x0 = fold(x0, k4, _mm_loadu_si128((const __m128i *)p));
        x1 = fold(x1, k4, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = fold(x2, k4, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = fold(x3, k4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        len -= 64;
    }
    x1 = fold(x0, k1, x1);
    x2 = fold(x1, k1, x2);
    x0 = fold(x2, k1, x3);
    for (; len >= 16; p += 16, len -= 16)
        x0 = fold(x0, k1, _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x0));
    c = _mm_crc32_u64(c, (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(x0, x0)));
    return ~(uint32_t)crc32c_sse42_raw(c, p, len);
}

static int hw_state = -1;   /* -1 unknown; benign race: every thread computes the same value */
static int clmul_state = -1;

int dkv_crc32c_hw(void)
{
    if (hw_state < 0) {
        __builtin_cpu_init();
        hw_state = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return hw_state;
}

int dkv_crc32c_clmul(void)
{
    if (clmul_state < 0) {
        __builtin_cpu_init();
        clmul_state = dkv_crc32c_hw() && __builtin_cpu_supports("pclmul") ? 1 : 0;
    }
    return clmul_state;
}

uint32_t dkv_crc32c(uint32_t seed, const uint8_t *buf, size_t len)
{
    if (len >= PCLMUL_MIN && dkv_crc32c_clmul())
        return crc32c_pclmul(seed, buf, len);
    if (dkv_crc32c_hw())
        return crc32c_sse42(seed, buf, len);
    return dkv_crc32c_portable(seed, buf, len);
}
void dkv__crc32c_x3(const uint32_t seed[3], const uint8_t *const p[3], const size_t len[3],
                    uint32_t out[3])
{
    if (dkv_crc32c_clmul() && len[0] >= PCLMUL_MIN && len[1] >= PCLMUL_MIN &&
        len[2] >= PCLMUL_MIN) {
        for (int i = 0; i < 3; i++)         /* faster still than three streams (above) */
            out[i] = crc32c_pclmul(seed[i], p[i], len[i]);
        return;
    }
    if (dkv_crc32c_hw()) {
        crc32c_x3_sse42(seed, p, len, out);
        return;
    }
    for (int i = 0; i < 3; i++)
        out[i] = dkv_crc32c_portable(seed[i], p[i], len[i]);
}
#else
int dkv_crc32c_hw(void) { return 0; }
int dkv_crc32c_clmul(void) { return 0; }

void dkv__crc32c_x3(const uint32_t seed[3], const uint8_t *const p[3], const size_t len[3],
                    uint32_t out[3])
{
    for (int i = 0; i < 3; i++)
        out[i] = dkv_crc32c_portable(seed[i], p[i], len[i]);
}

uint32_t dkv_crc32c(uint32_t seed, const uint8_t *buf, size_t len)
{
    return dkv_crc32c_portable(seed, buf, len);
}
#endif
