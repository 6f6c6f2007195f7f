/* CRC-32C (Castagnoli), RFC 3720: reflected polynomial 0x82F63B78, pre/post inversion.
 *
 * Two implementations with identical results: SSE4.2's crc32 instruction (8 bytes per
 * instruction) where the CPU has it, chosen at run time so one build runs on any x86-64;
 * and a portable slicing-by-8 table walk for every other CPU. `seed` is a previous result,
 * so crc(crc(0, a), b) == crc(0, a || b) (docs/FORMAT.md, top).
 */
#include <pthread.h>
#include <string.h>

#include "seglog.h"

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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t seed, const uint8_t *p, size_t len)
{
    uint64_t c = ~seed;
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
    return ~(uint32_t)c;
}

static int hw_state = -1;   /* -1 unknown; benign race: every thread computes the same value */

int dkv_crc32c_hw(void)
{
    if (hw_state < 0) {
        __builtin_cpu_init();
        hw_state = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return hw_state;
}

uint32_t dkv_crc32c(uint32_t seed, const uint8_t *buf, size_t len)
{
    if (dkv_crc32c_hw())
        return crc32c_sse42(seed, buf, len);
    return dkv_crc32c_portable(seed, buf, len);
}
#else
int dkv_crc32c_hw(void) { return 0; }

uint32_t dkv_crc32c(uint32_t seed, const uint8_t *buf, size_t len)
{
    return dkv_crc32c_portable(seed, buf, len);
}
#endif
