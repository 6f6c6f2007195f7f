/* An array of LSNs from a K_INDEX snapshot (FORMAT.md 5: little-endian u64 bytes), checked
 * before the store trusts it: a store's open restores one per run journal and per lane,
 * and the same checks as Python loops cost ~0.2 us an LSN -- 20 ms a 100,000-step journal. */
#include "seglog.h"

int dkv_lsns_check(const uint8_t *le, size_t n, uint64_t lo, uint64_t hi, int order)
{
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = le + 8 * i;
        uint64_t v = 0;
        for (int k = 7; k >= 0; k--)
            v = v << 8 | p[k];
        if (v < lo || v >= hi)
            return 1;
        if (i && (order == 2 ? v <= prev : order == 1 && v < prev))
            return 2;
        prev = v;
    }
    return 0;
}
