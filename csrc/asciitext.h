/* asciitext.h: ASCII bytes made into a str without Python's UTF-8 decoder, shared by
 * durkv's C extensions that decode msgpack (each compiles its own static copy).
 *
 * Python's decoder checks and copies a word per step behind several calls; for the
 * ASCII text most keys, names and messages are, testing the bytes here and copying them
 * into a new compact str is the same str for a fraction of the cost (a replay's result,
 * a message's content). Include after <Python.h>.
 */
#ifndef DKV_ASCIITEXT_H
#define DKV_ASCIITEXT_H

#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* all n bytes at p below 0x80? 64 at a time with SSE2, then eight, then one */
static inline int dkv_is_ascii(const unsigned char *p, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(p + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(p + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(p + i + 48));
        if (_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d))))
            return 0;
    }
#endif
    uint64_t acc = 0, w;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

/* The str of the ASCII bytes p[0:n] (dkv_is_ascii said so): what PyUnicode_DecodeUTF8
 * returns for them, made and filled at once. NULL with MemoryError. */
static inline PyObject *dkv_ascii_str(const unsigned char *p, size_t n)
{
    PyObject *s = PyUnicode_New((Py_ssize_t)n, 127);
    if (s != NULL)
        memcpy(PyUnicode_1BYTE_DATA(s), p, n);
    return s;
}

#endif
