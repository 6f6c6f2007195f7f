/* durkv._journalscan: a run's journal read for a replay, without a Python object a record.
 *
 * Store.journal_heads() answers one msgpack array of frame heads [kind, id, record]
 * (docs/FORMAT.md 5a: the record is a map with short keys). A replay needs, of each
 * plain STEP record, only what it compares the call with (kind, name, prompt version,
 * the inputs' bytes) and the result's bytes; decoding every record, or even building a
 * tuple of those fields for each, was most of the cost of re-executing a long run.
 *
 * index(heads) walks the array once and returns (lazy, rest, where, last):
 *
 *   lazy:  an Index of the plain STEP records, by step id: the first record of its step
 *          id (no earlier record of any kind names that id in `s`), kept as pointers into
 *          `heads` -- no Python object until asked. Its mapping side (len, `in`, get, pop,
 *          iteration in log order) answers a Lazy tuple (sid, fp, kind, name,
 *          prompt_version, inputs, result, t, record): each field as msgpack would
 *          decode it, a missing key as the fold defaults it (fp 0, kind "step", name "",
 *          the others None), `record` the record map's bytes (a copy).
 *          `limit`: records at or after that log position are not there (a fold applying
 *          the rest in log order sees only the lazy records before the one it applies).
 *          replay(): below.
 *   rest:  every other record, in order, as one msgpack array (bytes) for one decode;
 *   where: each rest record's position in the log (a list of int);
 *   last:  (position, t) of the last lazy record, or None.
 *
 * "Plain" is conservative: e == 2, s a str (or a compact step id, docs/FORMAT.md 5a: read as
 * its text, the str every reader makes of it), k/n str or missing, pv nil/str/missing, err
 * nil or missing, no ir, in and r bin/nil/missing, fp an int/nil/missing, t a number/nil/
 * missing, every key a str, and nothing in the map msgpack's decode could refuse or turn
 * into more than plain data (every str valid UTF-8, no extension type, no array or map as
 * a key): its decode at an unfold cannot fail. Anything else goes to `rest` (decoded
 * and folded as before), so the rule only decides what may stay unfolded, never what a
 * record means (kernel/runtime/journal.py: fold_lazy). A buffer that is not such an array
 * raises ValueError: the caller reads the journal the eager way, which names the bad frame.
 *
 * Index.replay(sid, name, args, kwargs, version, loads) is a replayed run.step in one call:
 * when the step's lazy record is kind "step", `name`, `version` (None or a str), and its
 * `in` is byte for byte what the default serde packs [list(args), kwargs] to, it returns
 * the recorded result decoded fresh -- by msgpack's rules for the native types (nil, bool,
 * int, float, str, bin, array, map: what serde.loads gives for them), by `loads` for
 * anything else (extension types). Any other case answers MISS, and the caller decides as
 * before (a fingerprint compare, a fold): MISS never means "not recorded as asked".
 *
 * Index.add(payload) holds a live run's own new STEP record as the open holds one it read:
 * `payload` is the COMMIT payload the log was given (u32 head_len, [kind, run_id, map],
 * u32 0: csrc/recpack.c), kept alive by the index, its map read by the same rule. A record
 * that is plain and the first of its step id in the index is added after the others (log
 * order: the journal's end) and True is answered; anything else adds nothing and answers
 * False -- the caller folds that record (journal.apply_step). The caller knows that no
 * folded entry has that step id: the index knows only its own records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"
#include <stdint.h>
#include <string.h>

#include "asciitext.h"
#include "prefault.h"
#include "seglog.h"           /* DKV_WOULD_WAIT */

#define MAX_DEPTH 512

typedef struct {
    const uint8_t *p, *end;
    uint8_t *buf;           /* put()'s: NULL, compare with [p, end); else write at p, grow */
} cur_t;

static int need(const cur_t *c, size_t n) { return (size_t)(c->end - c->p) >= n; }

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The length of a str/bin/ext/array/map header at c->p: sets *hdr (header bytes) and *len
 * (payload bytes for str/bin/ext -- ext's type byte included --, element count for
 * array/map). Returns the kind: 's' str, 'b' bin, 'x' ext, 'a' array, 'm' map, 'o' other
 * (a scalar: *hdr its whole size), 0 malformed. */
static int header(const cur_t *c, size_t *hdr, uint64_t *len)
{
    if (!need(c, 1))
        return 0;
    uint8_t b = c->p[0];
    static const uint8_t width[] = {1, 2, 4};
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        *hdr = 1, *len = 0;
        return 'o';
    }
    if (b >= 0x80 && b <= 0x8f) { *hdr = 1, *len = b & 0x0f; return 'm'; }
    if (b >= 0x90 && b <= 0x9f) { *hdr = 1, *len = b & 0x0f; return 'a'; }
    if (b >= 0xa0 && b <= 0xbf) { *hdr = 1, *len = b & 0x1f; return 's'; }
    int w, kind;
    switch (b) {
    case 0xca: *hdr = 5, *len = 0; return 'o';
    case 0xcb: *hdr = 9, *len = 0; return 'o';
    case 0xcc: case 0xd0: *hdr = 2, *len = 0; return 'o';
    case 0xcd: case 0xd1: *hdr = 3, *len = 0; return 'o';
    case 0xce: case 0xd2: *hdr = 5, *len = 0; return 'o';
    case 0xcf: case 0xd3: *hdr = 9, *len = 0; return 'o';
    case 0xd4: *hdr = 1, *len = 2; return 'x';
    case 0xd5: *hdr = 1, *len = 3; return 'x';
    case 0xd6: *hdr = 1, *len = 5; return 'x';
    case 0xd7: *hdr = 1, *len = 9; return 'x';
    case 0xd8: *hdr = 1, *len = 17; return 'x';
    case 0xc4: case 0xc5: case 0xc6: w = width[b - 0xc4]; kind = 'b'; break;
    case 0xc7: case 0xc8: case 0xc9: w = width[b - 0xc7]; kind = 'x'; break;
    case 0xd9: case 0xda: case 0xdb: w = width[b - 0xd9]; kind = 's'; break;
    case 0xdc: case 0xdd: w = b == 0xdc ? 2 : 4; kind = 'a'; break;
    case 0xde: case 0xdf: w = b == 0xde ? 2 : 4; kind = 'm'; break;
    default: return 0;      /* 0xc1: never used */
    }
    if (!need(c, 1 + (size_t)w))
        return 0;
    *hdr = 1 + (size_t)w;
    *len = be(c->p + 1, w) + (kind == 'x');
    return kind;
}

static int utf8_decodes(const uint8_t *s, size_t n);

/* s[0:n] is UTF-8 Python decodes: ASCII at once (keys, names and step ids are read at
 * every record of an open), anything else asked of Python's decoder. */
static inline int utf8_valid(const uint8_t *s, size_t n)
{
    return dkv_is_ascii(s, n) || utf8_decodes(s, n);
}

/* Skip one object (depth-limited); 0 ok, -1 malformed. With `odd`, set *odd when msgpack's
 * decode of it could fail or build more than plain data: a str that is not UTF-8, an
 * extension type (a bad timestamp raises), an array or map as a map key (unhashable). */
static int skip(cur_t *c, int depth, int *odd)
{
    size_t hdr;
    uint64_t len;
    int kind = header(c, &hdr, &len);
    if (!kind || depth > MAX_DEPTH || !need(c, hdr))
        return -1;
    c->p += hdr;
    if (kind == 'a' || kind == 'm') {
        uint64_t n = kind == 'm' ? 2 * len : len;
        for (uint64_t i = 0; i < n; i++) {
            uint8_t b = need(c, 1) ? c->p[0] : 0;
            if (odd != NULL && kind == 'm' && i % 2 == 0       /* a key: array or map? */
                    && ((b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf)))
                *odd = 1;
            if (skip(c, depth + 1, odd))
                return -1;
        }
        return 0;
    }
    if (kind == 'o')
        return 0;
    if ((uint64_t)(c->end - c->p) < len)
        return -1;
    if (odd != NULL && (kind == 'x' || (kind == 's' && !utf8_valid(c->p, (size_t)len))))
        *odd = 1;
    c->p += len;
    return 0;
}

/* A str at c->p: its bytes and length, the cursor moved past it; 0 if not a str. */
static int str_at(cur_t *c, const char **s, size_t *n)
{
    size_t hdr;
    uint64_t len;
    if (header(c, &hdr, &len) != 's' || (uint64_t)(c->end - c->p) - hdr < len)
        return 0;
    *s = (const char *)c->p + hdr;
    *n = (size_t)len;
    c->p += hdr + len;
    return 1;
}

/* A compact step id at v (FORMAT.md 5a), whose bytes a skip has already bounded: extension 1
 * of 16 bytes, or of 17 to 24 whose index does not begin with a zero byte. */
static int step_ext(const uint8_t *v)
{
    return (v[0] == 0xd8 && v[1] == 1)
           || (v[0] == 0xc7 && v[1] >= 17 && v[1] <= 24 && v[2] == 1 && v[19] != 0);
}

/* Its text, "U:N" (at most 57 characters), in out; returns the length. */
static size_t step_ext_text(const uint8_t *v, char out[64])
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *d = v[0] == 0xd8 ? v + 2 : v + 3;
    size_t k = v[0] == 0xd8 ? 0 : (size_t)v[1] - 16, o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[d[i] >> 4], out[o++] = hex[d[i] & 15];
    }
    out[o++] = ':';
    uint64_t n = be(d + 16, (int)k);
    char digits[20];
    int nd = 0;
    do
        digits[nd++] = (char)('0' + n % 10), n /= 10;
    while (n);
    while (nd)
        out[o++] = digits[--nd];
    return o;
}

/* The fields of a record map a replay reads; `plain` cleared by anything unusual. */
typedef struct {
    int plain, e_is_step;
    const uint8_t *s, *k, *n, *pv, *fp, *in, *r, *t;  /* each value's first byte, or NULL */
} fields_t;

static void field(fields_t *f, const char *key, size_t kn, const uint8_t *v)
{
    uint8_t b = v[0];
    int nil = b == 0xc0, str = (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
    int intv = b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3);
    int bin = b >= 0xc4 && b <= 0xc6;
    /* by length, then bytes: a record has ~10 keys, each read once per record at an open
     * and at every live step held (a chain of memcmp was ~250 instructions a key) */
    if (kn == 1) {
        /* tests in the order a record lists its keys (runtime/records.py KEYS): a chain
         * the branch predictor follows, where a switch's one indirect jump missed */
        char k0 = key[0];
        if (k0 == 'e')
            f->e_is_step = b == 0x02;   /* E_STEP: a positive fixint */
        else if (k0 == 't')
            f->t = v, f->plain &= nil || intv || b == 0xca || b == 0xcb;
        else if (k0 == 's')
            f->s = str || step_ext(v) ? v : NULL, f->plain &= f->s != NULL;
        else if (k0 == 'k')
            f->k = v, f->plain &= str;
        else if (k0 == 'n')
            f->n = v, f->plain &= str;
        else if (k0 == 'r')
            f->r = v, f->plain &= nil || bin;
    } else if (kn == 2) {
        if (key[0] == 'p' && key[1] == 'v')
            f->pv = v, f->plain &= str || nil;
        else if (key[0] == 'f' && key[1] == 'p')
            f->fp = v, f->plain &= intv || nil;
        else if (key[0] == 'i' && key[1] == 'n')
            f->in = v, f->plain &= nil || bin;
        else if (key[0] == 'i' && key[1] == 'r')
            f->plain = 0;
    } else if (kn == 3 && memcmp(key, "err", 3) == 0)
        f->plain &= nil;
}

/* skip(c, 1, odd) of a head's item or a record's value: a scalar, a short str or a bin8
 * read in line (most are; `odd` may be NULL as for skip), anything else by skip. Inlined:
 * an open calls it for every field of every record. */
static inline __attribute__((always_inline)) int skip_value(cur_t *c, int *odd)
{
    /* the size of a fixed-width scalar by its first byte, 0xc0-0xd3 (0: not one) */
    static const uint8_t width[20] = {1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 5, 9, 2, 3, 5, 9, 2, 3, 5, 9};
    uint8_t b = c->p[0];
    size_t n;
    if (b <= 0x7f || b >= 0xe0) {
        c->p++;
        return 0;
    }
    if (b >= 0xc0 && b <= 0xd3 && width[b - 0xc0]) {
        n = width[b - 0xc0];
        if ((size_t)(c->end - c->p) < n)
            return -1;
        c->p += n;
        return 0;
    }
    if ((b >= 0xa0 && b <= 0xbf) || b == 0xc4) {
        size_t hdr = b == 0xc4 ? 2 : 1;
        if ((size_t)(c->end - c->p) < hdr)
            return -1;
        n = b == 0xc4 ? c->p[1] : (size_t)(b & 0x1f);
        if ((size_t)(c->end - c->p) - hdr < n)
            return -1;
        if (odd != NULL && b != 0xc4 && !utf8_valid(c->p + hdr, n))
            *odd = 1;
        c->p += hdr + n;
        return 0;
    }
    return skip(c, 1, odd);
}

/* Read the record map at c->p (the cursor moved past it); 0 ok, -1 malformed. */
static int read_record(cur_t *c, fields_t *f)
{
    size_t hdr;
    uint64_t len;
    memset(f, 0, sizeof *f);
    f->plain = 1;
    if (need(c, 1) && c->p[0] >= 0x80 && c->p[0] <= 0x8f)     /* a fixmap: in line */
        hdr = 1, len = c->p[0] & 0x0f;
    else if (header(c, &hdr, &len) != 'm') {
        f->plain = 0;
        return skip(c, 0, NULL);
    }
    c->p += hdr;
    for (uint64_t i = 0; i < len; i++) {
        const char *key = NULL;
        size_t kn = 0;
        uint8_t kb = need(c, 1) ? c->p[0] : 0;
        if (kb >= 0xa0 && kb <= 0xbf && (size_t)(c->end - c->p) > (kb & 0x1fu)) {
            key = (const char *)c->p + 1, kn = kb & 0x1f;     /* a short key: most are */
            c->p += 1 + kn;
        } else if (!str_at(c, &key, &kn)) {
            f->plain = 0;                       /* a key that is not a str */
            key = NULL;
            if (skip(c, 1, NULL))
                return -1;
        }
        const uint8_t *v = c->p;
        int odd = 0;
        if (!need(c, 1) || skip_value(c, &odd))
            return -1;
        if (odd && kn == 1 && key[0] == 's' && step_ext(v))
            odd = 0;                    /* a compact step id: read as its text */
        f->plain &= !odd && (key == NULL || utf8_valid((const uint8_t *)key, kn));
        if (key != NULL)        /* read on past an odd key: `s` counts for every record */
            field(f, key, kn, v);
    }
    f->plain &= f->e_is_step && f->s != NULL;
    return 0;
}

/* The str of the UTF-8 bytes s[0:n]: ASCII made at once (asciitext.h), anything else by
 * Python's decoder (its error, if not UTF-8). */
static PyObject *text(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    return dkv_is_ascii(u, n) ? dkv_ascii_str(u, n) : PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, NULL);
}

/* The Python object msgpack decodes the scalar at v to (str, bin, int, float, nil). */
static PyObject *value(const uint8_t *v, const uint8_t *end)
{
    cur_t c = {v, end, NULL};
    size_t hdr;
    uint64_t len;
    int kind = header(&c, &hdr, &len);
    uint8_t b = v[0];
    if (kind == 's')
        return text((const char *)v + hdr, (size_t)len);
    if (kind == 'x' && step_ext(v)) {       /* only `s` is read where one may be */
        char text[64];
        size_t n = step_ext_text(v, text);
        return PyUnicode_FromStringAndSize(text, (Py_ssize_t)n);
    }
    if (kind == 'b')
        return PyBytes_FromStringAndSize((const char *)v + hdr, (Py_ssize_t)len);
    if (b == 0xc0)
        Py_RETURN_NONE;
    if (b <= 0x7f)
        return PyLong_FromLong(b);
    if (b >= 0xe0)
        return PyLong_FromLong((int8_t)b);
    if (b >= 0xcc && b <= 0xcf)
        return PyLong_FromUnsignedLongLong(be(v + 1, 1 << (b - 0xcc)));
    if (b >= 0xd0 && b <= 0xd3) {
        int w = 1 << (b - 0xd0);
        uint64_t u = be(v + 1, w);
        int64_t s = w == 8 ? (int64_t)u
                  : (int64_t)(u ^ (1ULL << (8 * w - 1))) - (int64_t)(1ULL << (8 * w - 1));
        return PyLong_FromLongLong(s);
    }
    if (b == 0xcb) {
        uint64_t u = be(v + 1, 8);
        double d;
        memcpy(&d, &u, sizeof d);
        return PyFloat_FromDouble(d);
    }
    if (b == 0xca) {
        uint32_t u = (uint32_t)be(v + 1, 4);
        float fl;
        memcpy(&fl, &u, sizeof fl);
        return PyFloat_FromDouble(fl);
    }
    PyErr_SetString(PyExc_ValueError, "unexpected msgpack value");
    return NULL;
}

/* The field's object, or `dflt` (a new reference) when the key is missing. A str equal to
 * the previous one of the same field is that object again (kinds and names repeat). */
static PyObject *field_value(const uint8_t *v, const uint8_t *end, PyObject *dflt,
                             PyObject **last)
{
    if (v == NULL) {
        Py_INCREF(dflt);
        return dflt;
    }
    if (last != NULL && *last != NULL && v[0] >= 0xa0 && v[0] <= 0xbf) {
        Py_ssize_t n = v[0] & 0x1f, ln;
        const char *u = PyUnicode_AsUTF8AndSize(*last, &ln);
        if (u != NULL && ln == n && memcmp(u, v + 1, (size_t)n) == 0) {
            Py_INCREF(*last);
            return *last;
        }
        PyErr_Clear();
    }
    PyObject *o = value(v, end);
    if (o != NULL && last != NULL && PyUnicode_CheckExact(o)) {
        Py_XSETREF(*last, o);
        Py_INCREF(o);
    }
    return o;
}

static PyObject *step_tuple(const fields_t *f, const uint8_t *rec, Py_ssize_t len,
                            PyObject *defaults[2], PyObject *last[2])
{
    const uint8_t *end = rec + len;     /* every field is inside its record */
    PyObject *t = PyTuple_New(9);
    if (t == NULL)
        return NULL;
    PyObject *items[9] = {
        field_value(f->s, end, Py_None, NULL),
        f->fp == NULL ? PyLong_FromLong(0) : field_value(f->fp, end, Py_None, NULL),
        field_value(f->k, end, defaults[0], &last[0]),
        field_value(f->n, end, defaults[1], &last[1]),
        field_value(f->pv, end, Py_None, NULL),
        field_value(f->in, end, Py_None, NULL),
        field_value(f->r, end, Py_None, NULL),
        field_value(f->t, end, Py_None, NULL),
        PyBytes_FromStringAndSize((const char *)rec, len),
    };
    int ok = 1;
    for (int i = 0; i < 9; i++) {
        if (items[i] == NULL)
            ok = 0;
        PyTuple_SET_ITEM(t, i, items[i] == NULL ? Py_NewRef(Py_None) : items[i]);
    }
    if (!ok) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}


/* ---- the index ----------------------------------------------------------------------- */

enum { LAZY = 1, SEEN = 2, POPPED = 3 };    /* SEEN: named by a record in `rest` */

typedef struct {
    fields_t f;
    const uint8_t *rec;         /* the record map: in the heads, or in `own` */
    Py_ssize_t len, pos;
    const char *sid;
    Py_ssize_t sidn;
    char *sidbuf;               /* a compact step id's text (sid points here), else NULL */
    int state;
    PyObject *own;              /* add(): the payload (bytes) holding rec; NULL: the heads' */
} entry_t;

typedef struct {
    uint32_t at, tag;           /* entry index + 1 (0: empty), the hash's high half */
} slot_t;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    entry_t *e;
    Py_ssize_t n, cap, live, limit;     /* cap: entries allocated (add() grows them) */
    Py_ssize_t hint;            /* the entry after the last one replayed: a replay goes in order */
    Py_ssize_t first;           /* no lazy entry before this one (index_bool) */
    slot_t *slots;              /* open addressing */
    uint32_t *dense;            /* entry index + 1 by automatic step id (dense_at) */
    uint64_t ndense;
    size_t mask;
} Index;

static PyObject *MISS;

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

static uint64_t fnv(const char *s, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return mix(h);              /* FNV's low bits mix only the bytes' low bits: spread them */
}

/* An automatic step id's number: decimal digits in canonical form (no leading zero), below
 * the dense table's size. Such ids (most of a run's) are found in ix->dense by number:
 * in log order, the build and a replay walk it in order instead of missing the cache at
 * every record as a hash would. */
static int number(const char *s, Py_ssize_t n, uint64_t *v)
{
    if (n < 1 || n > 18 || (s[0] == '0' && n > 1))
        return 0;
    *v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        *v = *v * 10 + (uint64_t)(s[i] - '0');
    }
    return 1;
}

static int dense_at(const Index *ix, const char *s, Py_ssize_t n, uint64_t *v)
{
    return number(s, n, v) && *v < ix->ndense;
}

/* The entry of the step id s[0:n] (any state), or NULL. */
static entry_t *lookup(const Index *ix, const char *s, Py_ssize_t n)
{
    uint64_t v;
    if (dense_at(ix, s, n, &v))
        return ix->dense[v] ? &ix->e[ix->dense[v] - 1] : NULL;
    uint64_t h = fnv(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        const slot_t *sl = &ix->slots[i];
        if (sl->at == 0)
            return NULL;
        if (sl->tag != tag)     /* most probes end here, without touching the entry */
            continue;
        entry_t *e = &ix->e[sl->at - 1];
        if (e->sidn == n && memcmp(e->sid, s, (size_t)n) == 0)
            return e;
    }
}

/* The entry of ix->e[at]'s step id already in the tables, or NULL: then ix->e[at] is. */
static entry_t *find_or_add(Index *ix, Py_ssize_t at)
{
    entry_t *e = &ix->e[at];
    uint64_t v;
    if (dense_at(ix, e->sid, e->sidn, &v)) {
        if (ix->dense[v])
            return &ix->e[ix->dense[v] - 1];
        ix->dense[v] = (uint32_t)(at + 1);
        return NULL;
    }
    uint64_t h = fnv(e->sid, e->sidn);
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        slot_t *sl = &ix->slots[i];
        if (sl->at == 0) {
            sl->at = (uint32_t)(at + 1), sl->tag = tag;
            return NULL;
        }
        entry_t *o = &ix->e[sl->at - 1];
        if (sl->tag == tag && o->sidn == e->sidn && memcmp(o->sid, e->sid, (size_t)e->sidn) == 0)
            return o;
    }
}

/* The lazy entry of `key` visible below `limit`, or NULL (no exception set). `key` is a
 * step id, or (replay) an int whose str() is one: no str made for an automatic id. */
static entry_t *lazy_of(const Index *ix, PyObject *key, int numbers)
{
    char num[24];
    Py_ssize_t n;
    const char *s;
    if (numbers && PyLong_CheckExact(key)) {
        long long v = PyLong_AsLongLong(key);
        if (v == -1 && PyErr_Occurred())
            return PyErr_Clear(), NULL;
        char *p = num + sizeof num;     /* str(v), right to left */
        unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
        do
            *--p = (char)('0' + u % 10);
        while (u /= 10);
        if (v < 0)
            *--p = '-';
        s = p;
        n = num + sizeof num - p;
    } else if (PyUnicode_CheckExact(key)) {
        s = PyUnicode_AsUTF8AndSize(key, &n);
        if (s == NULL)
            return PyErr_Clear(), NULL;
    } else
        return NULL;
    entry_t *e = ix->hint < ix->n ? &ix->e[ix->hint] : NULL;
    if (e == NULL || e->state != LAZY || e->sidn != n       /* LAZY: its step id's one */
            || memcmp(e->sid, s, (size_t)n) != 0)
        e = lookup(ix, s, n);
    return e != NULL && e->state == LAZY && e->pos < ix->limit ? e : NULL;
}

/* utf8_valid's answer for bytes that are not all ASCII */
static int utf8_decodes(const uint8_t *s, size_t n)
{
    PyObject *o = PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, NULL);
    if (o == NULL)
        return PyErr_Clear(), 0;
    Py_DECREF(o);
    return 1;
}

static PyObject *lazy_tuple(const entry_t *e)
{
    /* copies: building the tuple runs allocations (the GC, and any code it runs, may
     * add() to this index and move its entries); the bytes pointed to do not move */
    const fields_t f = e->f;
    const uint8_t *rec = e->rec;
    Py_ssize_t len = e->len;
    PyObject *defaults[2] = {PyUnicode_FromString("step"), PyUnicode_FromString("")};
    PyObject *last[2] = {NULL, NULL}, *t = NULL;
    if (defaults[0] != NULL && defaults[1] != NULL)
        t = step_tuple(&f, rec, len, defaults, last);
    Py_XDECREF(defaults[0]);
    Py_XDECREF(defaults[1]);
    Py_XDECREF(last[0]);
    Py_XDECREF(last[1]);
    return t;
}

static PyObject *bad(Py_ssize_t i, const char *why)
{
    PyErr_Format(PyExc_ValueError, "journal head %zd: %s", i, why);
    return NULL;
}

/* Read the record of head i at c->p into ix->e[i] (its fields, state 0). */
static int read_head(Index *ix, cur_t *c, Py_ssize_t i)
{
    size_t hdr;
    uint64_t m;
    entry_t *e = &ix->e[i];
    if (need(c, 1) && c->p[0] >= 0x93 && c->p[0] <= 0x9f)     /* a fixarray: in line */
        hdr = 1, m = c->p[0] & 0x0f;
    else if (header(c, &hdr, &m) != 'a' || m < 3)
        return bad(i, "not a list of 3 or more"), -1;
    c->p += hdr;
    if (!need(c, 1) || skip_value(c, NULL) || !need(c, 1) || skip_value(c, NULL))
        return bad(i, "malformed"), -1;
    e->rec = c->p;
    if (read_record(c, &e->f))
        return bad(i, "malformed record"), -1;
    e->len = c->p - e->rec;
    e->pos = i;
    for (uint64_t j = 3; j < m; j++)       /* a later version's longer head */
        if (skip(c, 1, NULL))
            return bad(i, "malformed"), -1;
    if (e->f.s != NULL) {
        cur_t sc = {e->f.s, c->end, NULL};
        size_t sn = 0;
        uint8_t sb = e->f.s[0];
        if (sb >= 0xa0 && sb <= 0xbf)   /* a fixstr, its bounds checked as the map was read */
            e->sid = (const char *)e->f.s + 1, sn = sb & 0x1f;
        else if (step_ext(e->f.s)) {    /* a compact step id: keyed by its text */
            if ((e->sidbuf = PyMem_Malloc(64)) == NULL)
                return PyErr_NoMemory(), -1;
            sn = step_ext_text(e->f.s, e->sidbuf);
            e->sid = e->sidbuf;
        } else if (!str_at(&sc, &e->sid, &sn))
            e->sid = NULL, e->f.plain = 0;
        e->sidn = (Py_ssize_t)sn;
    }
    return 0;
}

/* Sort head i: lazy (the first plain record of its step id), or into `rest`. */
static int sort_head(Index *ix, Py_ssize_t i, PyObject *rest, PyObject *where,
                     Py_ssize_t *last)
{
    entry_t *e = &ix->e[i];
    if (e->sid != NULL && find_or_add(ix, i) == NULL) {     /* its step id's first record */
        e->state = e->f.plain ? LAZY : SEEN;
        if (e->state == LAZY) {
            ix->live++;
            *last = i;
            return 0;
        }
    }
    Py_ssize_t at = PyByteArray_GET_SIZE(rest);
    if (PyByteArray_Resize(rest, at + e->len) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(rest) + at, e->rec, (size_t)e->len);
    PyObject *p = PyLong_FromSsize_t(i);
    int err = p == NULL || PyList_Append(where, p);
    Py_XDECREF(p);
    return err ? -1 : 0;
}

static PyTypeObject IndexType;

static int build(Index *ix, PyObject *rest, PyObject *where, Py_ssize_t *last)
{
    const uint8_t *start = ix->view.buf;
    cur_t c = {start, start + ix->view.len, NULL};
    size_t hdr;
    uint64_t n;
    if (header(&c, &hdr, &n) != 'a' || n > (uint64_t)ix->view.len || n >= UINT32_MAX) {
        bad(-1, "the heads are not a msgpack array");
        return -1;
    }
    c.p += hdr;
    ix->n = (Py_ssize_t)n;
    size_t cap = 8;
    while (cap < 2 * n + 2)
        cap <<= 1;
    ix->cap = n ? (Py_ssize_t)n : 1;
    ix->e = PyMem_Calloc((size_t)ix->cap, sizeof(entry_t));
    ix->slots = PyMem_Calloc(cap, sizeof(slot_t));
    ix->mask = cap - 1;
    ix->ndense = n + 64;
    ix->dense = PyMem_Calloc(ix->ndense, sizeof(uint32_t));
    if (ix->e == NULL || ix->slots == NULL || ix->dense == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    dkv_hugepages(ix->e, (size_t)ix->cap * sizeof(entry_t));
    dkv_prefault(ix->e, (size_t)ix->cap * sizeof(entry_t));
    dkv_hugepages(ix->slots, cap * sizeof(slot_t));
    dkv_prefault(ix->slots, cap * sizeof(slot_t));
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++)
        if (read_head(ix, &c, i) || sort_head(ix, i, rest, where, last))
            return -1;
    if (c.p != c.end) {
        bad(-1, "bytes after the heads");
        return -1;
    }
    return 0;
}

/* index(heads) -> (lazy, rest, where, last): see the top of this file. */
static PyObject *index_heads(PyObject *self, PyObject *arg)
{
    (void)self;
    Index *ix = PyObject_New(Index, &IndexType);
    if (ix == NULL)
        return NULL;
    ix->e = NULL, ix->slots = NULL, ix->dense = NULL, ix->ndense = 0;
    ix->n = ix->cap = ix->live = ix->hint = ix->first = 0;
    ix->limit = PY_SSIZE_T_MAX;
    ix->view.obj = NULL;
    if (PyObject_GetBuffer(arg, &ix->view, PyBUF_SIMPLE) < 0) {
        ix->view.obj = NULL;
        Py_DECREF(ix);
        return NULL;
    }
    PyObject *rest = PyByteArray_FromStringAndSize("\xdd\0\0\0\0", 5);  /* array32 */
    PyObject *where = PyList_New(0), *result = NULL;
    Py_ssize_t last = -1;
    if (rest == NULL || where == NULL || build(ix, rest, where, &last))
        goto done;
    Py_ssize_t nrest = PyList_GET_SIZE(where);
    uint8_t *h = (uint8_t *)PyByteArray_AS_STRING(rest) + 1;
    h[0] = (uint8_t)(nrest >> 24), h[1] = (uint8_t)(nrest >> 16);
    h[2] = (uint8_t)(nrest >> 8), h[3] = (uint8_t)nrest;
    PyObject *lastv = Py_None;
    if (last >= 0) {
        const entry_t *e = &ix->e[last];
        PyObject *t = field_value(e->f.t, (const uint8_t *)ix->view.buf + ix->view.len,
                                  Py_None, NULL);
        lastv = t == NULL ? NULL : Py_BuildValue("(nN)", last, t);
        if (lastv == NULL)
            goto done;
    } else
        Py_INCREF(lastv);
    result = Py_BuildValue("(OOON)", ix, rest, where, lastv);
done:
    Py_XDECREF(rest);
    Py_XDECREF(where);
    Py_DECREF(ix);
    return result;
}

static void index_dealloc(Index *ix)
{
    for (Py_ssize_t i = 0; ix->e != NULL && i < ix->n; i++) {
        Py_XDECREF(ix->e[i].own);
        PyMem_Free(ix->e[i].sidbuf);
    }
    PyMem_Free(ix->e);
    PyMem_Free(ix->slots);
    PyMem_Free(ix->dense);
    if (ix->view.obj != NULL)
        PyBuffer_Release(&ix->view);
    PyObject_Free(ix);
}

/* O(records) under a limit: only a fold sets one, and it asks for truth (index_bool). */
static Py_ssize_t index_len(Index *ix)
{
    if (ix->limit == PY_SSIZE_T_MAX)
        return ix->live;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < ix->n && i < ix->limit; i++)
        n += ix->e[i].state == LAZY;
    return n;
}

/* Truth: any lazy record before the limit. O(1) amortized (a fold asks before every
 * record it applies): `first` only moves on, past records folded or not lazy. */
static int index_bool(Index *ix)
{
    while (ix->first < ix->n && ix->e[ix->first].state != LAZY)
        ix->first++;
    return ix->first < ix->n && ix->first < ix->limit;
}

static int index_contains(Index *ix, PyObject *key)
{
    return lazy_of(ix, key, 0) != NULL;
}

static PyObject *index_get(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2)
        return PyErr_Format(PyExc_TypeError, "get(sid[, default])");
    entry_t *e = lazy_of(ix, args[0], 0);
    if (e == NULL)
        return Py_NewRef(nargs == 2 ? args[1] : Py_None);
    return lazy_tuple(e);
}

static PyObject *index_pop(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2)
        return PyErr_Format(PyExc_TypeError, "pop(sid[, default])");
    entry_t *e = lazy_of(ix, args[0], 0);
    if (e == NULL) {
        if (nargs == 2)
            return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    Py_ssize_t i = e - ix->e;
    PyObject *t = lazy_tuple(e);
    if (t != NULL)
        ix->e[i].state = POPPED, ix->live--;
    return t;
}

static PyObject *index_iter(Index *ix)
{
    PyObject *sids = PyList_New(0);
    for (Py_ssize_t i = 0; sids != NULL && i < ix->n && i < ix->limit; i++) {
        const entry_t *e = &ix->e[i];
        if (e->state != LAZY)
            continue;
        PyObject *s = value(e->f.s, e->rec + e->len);
        if (s == NULL || PyList_Append(sids, s))
            Py_CLEAR(sids);
        Py_XDECREF(s);
    }
    if (sids == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(sids);
    Py_DECREF(sids);
    return it;
}

/* ---- a replayed call: compare with the default serde's bytes, decode the result ------ */

/* The bytes msgpack's Packer(use_bin_type=True, strict_types=True) gives a value, compared
 * as they are produced with the recorded ones at c->p: 1 equal so far, 0 not, -1 a value
 * this does not pack (another type: the serde's extension types decide). */
/* put() into a buffer it grows: pack_native's. */
static int put_grow(cur_t *c, const uint8_t *b, size_t n)
{
    size_t at = (size_t)(c->p - c->buf), cap = (size_t)(c->end - c->buf);
    if (cap - at < n) {
        size_t ncap = 2 * cap > at + n ? 2 * cap : at + n + 256;
        uint8_t *nb = PyMem_Realloc(c->buf, ncap);
        if (nb == NULL)
            return -1;              /* not packed here: the serde's path */
        c->buf = nb, c->p = nb + at, c->end = nb + ncap;
    }
    memcpy(c->buf + at, b, n);
    c->p += n;
    return 1;
}

/* The default serde's encoding, a byte string at a time: compared with the bytes at c->p
 * (a replay's test), or written (c->buf). */
static int put(cur_t *c, const uint8_t *b, size_t n)
{
    if (c->buf != NULL)
        return put_grow(c, b, n);
    if (!need(c, n) || memcmp(c->p, b, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

static int put_head(cur_t *c, uint8_t small, uint8_t b8, uint8_t b16, uint8_t b32,
                    uint64_t n, int fix_max)
{
    uint8_t h[5];
    if ((int64_t)n <= fix_max && small)
        return h[0] = (uint8_t)(small | n), put(c, h, 1);
    if (b8 && n < 256)
        return h[0] = b8, h[1] = (uint8_t)n, put(c, h, 2);
    if (n < 65536)
        return h[0] = b16, h[1] = (uint8_t)(n >> 8), h[2] = (uint8_t)n, put(c, h, 3);
    h[0] = b32, h[1] = (uint8_t)(n >> 24), h[2] = (uint8_t)(n >> 16);
    h[3] = (uint8_t)(n >> 8), h[4] = (uint8_t)n;
    return n <= UINT32_MAX ? put(c, h, 5) : -1;
}

static int put_be(cur_t *c, uint8_t tag, uint64_t v, int w)
{
    uint8_t h[9];
    h[0] = tag;
    for (int i = 0; i < w; i++)
        h[1 + i] = (uint8_t)(v >> (8 * (w - 1 - i)));
    return put(c, h, 1 + (size_t)w);
}

static int put_int(cur_t *c, PyObject *o)
{
    int overflow;
    long long d = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return PyErr_Clear(), -1;      /* beyond 64 bits: the bigint extension */
        return put_be(c, 0xcf, u, 8);
    }
    if (overflow < 0 || (d == -1 && PyErr_Occurred()))
        return PyErr_Clear(), -1;
    uint8_t b = (uint8_t)d;
    if (d >= -32 && d < 128)
        return put(c, &b, 1);
    if (d < 0)
        return d >= -128 ? put_be(c, 0xd0, (uint64_t)d, 1)
             : d >= -32768 ? put_be(c, 0xd1, (uint64_t)d, 2)
             : d >= -2147483648LL ? put_be(c, 0xd2, (uint64_t)d, 4)
             : put_be(c, 0xd3, (uint64_t)d, 8);
    return d < 256 ? put_be(c, 0xcc, (uint64_t)d, 1)
         : d < 65536 ? put_be(c, 0xcd, (uint64_t)d, 2)
         : d <= 0xffffffffLL ? put_be(c, 0xce, (uint64_t)d, 4)
         : put_be(c, 0xcf, (uint64_t)d, 8);
}

static int put_obj(cur_t *c, PyObject *o, int depth);

static int put_seq(cur_t *c, PyObject *const *items, Py_ssize_t n, int depth)
{
    int r = put_head(c, 0x90, 0, 0xdc, 0xdd, (uint64_t)n, 15);
    for (Py_ssize_t i = 0; r == 1 && i < n; i++)
        r = put_obj(c, items[i], depth + 1);
    return r;
}

static int put_obj(cur_t *c, PyObject *o, int depth)
{
    uint8_t b;
    if (depth > 64)
        return -1;
    if (o == Py_None)
        return b = 0xc0, put(c, &b, 1);
    if (o == Py_True || o == Py_False)
        return b = o == Py_True ? 0xc3 : 0xc2, put(c, &b, 1);
    if (PyLong_CheckExact(o))
        return put_int(c, o);
    if (PyFloat_CheckExact(o)) {
        double d = PyFloat_AS_DOUBLE(o);
        uint64_t u;
        memcpy(&u, &d, sizeof u);
        return put_be(c, 0xcb, u, 8);
    }
    if (PyUnicode_CheckExact(o)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL)
            return PyErr_Clear(), -1;
        int r = put_head(c, 0xa0, 0xd9, 0xda, 0xdb, (uint64_t)n, 31);
        return r == 1 ? put(c, (const uint8_t *)s, (size_t)n) : r;
    }
    if (PyBytes_CheckExact(o)) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        int r = put_head(c, 0, 0xc4, 0xc5, 0xc6, (uint64_t)n, -1);
        return r == 1 ? put(c, (const uint8_t *)PyBytes_AS_STRING(o), (size_t)n) : r;
    }
    if (PyList_CheckExact(o))
        return put_seq(c, PySequence_Fast_ITEMS(o), PyList_GET_SIZE(o), depth);
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int r = put_head(c, 0x80, 0, 0xde, 0xdf, (uint64_t)PyDict_GET_SIZE(o), 15);
        while (r == 1 && PyDict_Next(o, &pos, &k, &v))
            if ((r = put_obj(c, k, depth + 1)) == 1)
                r = put_obj(c, v, depth + 1);
        return r;
    }
    return -1;
}

/* The default serde's bytes of `o` (MsgpackSerde.dumps': msgpack's, use_bin_type,
 * strict_types) when `o` is made of the exact native types put_obj packs, as the replay's
 * test compares them; else NULL and no exception: the caller calls the serde, which
 * stays the definition of everything else. */
static PyObject *pack_native(PyObject *o)
{
    uint8_t *b = PyMem_Malloc(512);
    if (b == NULL)
        return NULL;
    cur_t c = {b, b + 512, b};
    PyObject *out = NULL;
    if (put_obj(&c, o, 0) == 1)
        out = PyBytes_FromStringAndSize((const char *)c.buf, c.p - c.buf);
    PyMem_Free(c.buf);
    return out;
}

/* The recorded field at v (a str header, or NULL: `dflt`) is the text u[0:n]. */
static int field_is(const uint8_t *v, const uint8_t *end, const char *dflt, const char *u,
                    size_t n)
{
    if (v == NULL)
        return strlen(dflt) == n && memcmp(u, dflt, n) == 0;
    cur_t c = {v, end, NULL};
    const char *r;
    size_t rn;
    return str_at(&c, &r, &rn) && rn == n && memcmp(r, u, n) == 0;
}

/* The call's version is the recorded `pv` (nil or missing: None). */
static int same_version(const uint8_t *pv, const uint8_t *end, PyObject *version)
{
    if (version == Py_None)
        return pv == NULL || pv[0] == 0xc0;
    Py_ssize_t n;
    const char *u = PyUnicode_CheckExact(version) ? PyUnicode_AsUTF8AndSize(version, &n) : NULL;
    if (u == NULL)
        return PyErr_Clear(), 0;
    return pv != NULL && pv[0] != 0xc0 && field_is(pv, end, "", u, (size_t)n);
}

/* The recorded `in` (a bin) is what the default serde packs [list(args), kwargs] to. */
static int same_inputs(const uint8_t *in, const uint8_t *end, PyObject *args, PyObject *kwargs)
{
    cur_t c = {in, end, NULL};
    size_t hdr;
    uint64_t len;
    if (in == NULL || header(&c, &hdr, &len) != 'b' || (uint64_t)(end - in) - hdr < len)
        return 0;
    cur_t r = {in + hdr, in + hdr + len, NULL};
    uint8_t pair = 0x92;
    return put(&r, &pair, 1) == 1
           && put_seq(&r, PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args), 0) == 1
           && put_obj(&r, kwargs, 1) == 1 && r.p == r.end;
}

/* PyUnicode_InternInPlace(&k), with the last short keys kept: a replay decodes the same
 * few keys again and again, and the interned table's lookup was a tenth of its time. */
static PyObject *key_cache[64];

static PyObject *interned(PyObject *k)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(k);
    if (!PyUnicode_IS_ASCII(k) || n > 32) {
        PyUnicode_InternInPlace(&k);
        return k;
    }
    const char *s = (const char *)PyUnicode_DATA(k);
    PyObject **slot = &key_cache[fnv(s, n) & 63];
    if (*slot != NULL && PyUnicode_GET_LENGTH(*slot) == n
            && memcmp(PyUnicode_DATA(*slot), s, (size_t)n) == 0) {
        Py_DECREF(k);
        return Py_NewRef(*slot);
    }
    PyUnicode_InternInPlace(&k);
    Py_XSETREF(*slot, Py_NewRef(k));
    return k;
}

/* The cached key (a new reference) whose text is the short str at c->p, the cursor moved
 * past it; NULL (nothing read) when there is none: the cache holds only ASCII keys, so
 * the same bytes are the same text, and no str is made and dropped for it. */
static PyObject *cached_key(cur_t *c)
{
    uint8_t b = c->p < c->end ? c->p[0] : 0;
    size_t n = b & 0x1f;
    if (b < 0xa0 || b > 0xbf || (size_t)(c->end - c->p) <= n)
        return NULL;
    const char *s = (const char *)c->p + 1;
    PyObject *k = key_cache[fnv(s, (Py_ssize_t)n) & 63];
    if (k == NULL || PyUnicode_GET_LENGTH(k) != (Py_ssize_t)n
            || memcmp(PyUnicode_DATA(k), s, n) != 0)
        return NULL;
    c->p += 1 + n;
    return Py_NewRef(k);
}

/* The object msgpack.unpackb(raw=False, strict_map_key=False) gives the value at c->p,
 * for the native types; NULL (no exception set) for anything else -- an extension type,
 * an error msgpack would raise --: the caller asks the serde. */
static PyObject *decode(cur_t *c, int depth)
{
    size_t hdr;
    uint64_t len;
    int kind = header(c, &hdr, &len);
    if (!kind || kind == 'x' || depth > 64 || !need(c, hdr))
        return NULL;
    const uint8_t *v = c->p;
    if (kind == 'o') {
        c->p += hdr;
        if (v[0] == 0xc2 || v[0] == 0xc3)
            return Py_NewRef(v[0] == 0xc3 ? Py_True : Py_False);
        PyObject *o = value(v, c->end);
        if (o == NULL)
            PyErr_Clear();
        return o;
    }
    if (kind == 's' || kind == 'b') {
        if ((uint64_t)(c->end - v) - hdr < len)
            return NULL;
        c->p += hdr + len;
        PyObject *o = value(v, c->end);
        if (o == NULL)
            PyErr_Clear();
        return o;
    }
    c->p += hdr;
    if (len > (uint64_t)(c->end - c->p))    /* each item takes a byte at least */
        return NULL;
    if (kind == 'a') {
        PyObject *l = PyList_New((Py_ssize_t)len);
        for (uint64_t i = 0; l != NULL && i < len; i++) {
            PyObject *x = decode(c, depth + 1);
            if (x == NULL)
                Py_CLEAR(l);
            else
                PyList_SET_ITEM(l, (Py_ssize_t)i, x);
        }
        return l;
    }
    PyObject *d = _PyDict_NewPresized((Py_ssize_t)len);
    for (uint64_t i = 0; d != NULL && i < len; i++) {
        PyObject *k = cached_key(c);
        if (k == NULL) {
            k = decode(c, depth + 1);
            if (k != NULL && PyUnicode_CheckExact(k))
                k = interned(k);                /* as msgpack does its map keys */
        }
        PyObject *x = k == NULL ? NULL : decode(c, depth + 1);
        if (x == NULL || PyDict_SetItem(d, k, x) < 0) {
            PyErr_Clear();
            Py_CLEAR(d);
        }
        Py_XDECREF(k);
        Py_XDECREF(x);
    }
    return d;
}

/* The recorded result at v: decoded here, or by `loads` -- the serde's own, for what
 * the native decode does not read; NULL: `run`'s _loads, looked up only then (run.step's
 * entry: most replays never need it) */
static PyObject *result_of(const uint8_t *v, const uint8_t *end, PyObject *loads,
                           PyObject *run)
{
    cur_t c = {v, end, NULL};
    size_t hdr;
    uint64_t len;
    if (header(&c, &hdr, &len) != 'b' || (uint64_t)(end - v) - hdr < len)
        return NULL;
    cur_t r = {v + hdr, v + hdr + len, NULL};
    PyObject *o = decode(&r, 0);
    if (o != NULL && r.p == r.end)
        return o;
    Py_XDECREF(o);              /* trailing bytes, an extension type...: the serde's own */
    PyObject *b = PyBytes_FromStringAndSize((const char *)v + hdr, (Py_ssize_t)len);
    if (b == NULL)
        return NULL;
    PyObject *own = loads == NULL ? PyObject_GetAttrString(run, "_loads") : NULL;
    o = loads != NULL || own != NULL ? PyObject_CallOneArg(loads ? loads : own, b) : NULL;
    Py_XDECREF(own);
    Py_DECREF(b);
    return o;
}

static PyObject *replay_entry(Index *ix, entry_t *e, PyObject *const *a);

/* replay(sid, name, args, kwargs, version, loads): see the top of this file. */
static PyObject *index_replay(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "replay(sid, name, args, kwargs, version, loads)");
    return replay_entry(ix, lazy_of(ix, args[0], 1), args + 1);
}

/* Index.replay's test and answer for the lazy entry `e` (NULL: MISS); a[0:5] are its
 * arguments after the step id (a[4], loads, NULL: a[-1]'s _loads, the run's). */
static PyObject *replay_entry(Index *ix, entry_t *e, PyObject *const *a)
{
    PyObject *const *args = a - 1;
    Py_ssize_t n;
    const char *name = PyUnicode_CheckExact(args[1]) ? PyUnicode_AsUTF8AndSize(args[1], &n)
                                                      : NULL;
    if (name == NULL)
        PyErr_Clear();
    if (e == NULL || name == NULL || !PyTuple_CheckExact(args[2])
            || !PyDict_CheckExact(args[3]) || e->f.r == NULL || e->f.r[0] == 0xc0)
        return Py_NewRef(MISS);
    const fields_t *f = &e->f;
    const uint8_t *end = e->rec + e->len;
    if (!field_is(f->k, end, "step", "step", 4) || !field_is(f->n, end, "", name, (size_t)n)
            || !same_version(f->pv, end, args[4]) || !same_inputs(f->in, end, args[2], args[3]))
        return Py_NewRef(MISS);
    ix->hint = e - ix->e + 1;
    return result_of(f->r, end, args[5], args[0]);  /* f->r read before loads() may run */
}

/* ---- a live run's own new step: held as its record's bytes ---------------------------- */

/* Rebuild the step id tables over ix->e[0:n] with `nslots` hash slots (a power of 2) and
 * `ndense` automatic ids: each step id's first entry, as build() put them. */
static int retable(Index *ix, size_t nslots, uint64_t ndense)
{
    slot_t *slots = PyMem_Calloc(nslots, sizeof(slot_t));
    uint32_t *dense = PyMem_Calloc((size_t)ndense, sizeof(uint32_t));
    if (slots == NULL || dense == NULL) {
        PyMem_Free(slots);
        PyMem_Free(dense);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(ix->slots);
    PyMem_Free(ix->dense);
    ix->slots = slots, ix->dense = dense, ix->mask = nslots - 1, ix->ndense = ndense;
    for (Py_ssize_t i = 0; i < ix->n; i++)
        if (ix->e[i].sid != NULL)
            find_or_add(ix, i);
    return 0;
}

/* Room for one more entry, whose step id is s[0:n]: the entries, the hash table (at most
 * half full) and the dense table (an automatic id just past it: the next ones follow). */
static int room(Index *ix, const char *s, Py_ssize_t n)
{
    if (ix->n + 1 >= (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a run's index holds fewer than 2^32 records");
        return -1;
    }
    if (ix->n == ix->cap) {
        Py_ssize_t cap = ix->cap < 16 ? 16 : 2 * ix->cap;
        entry_t *e = PyMem_Realloc(ix->e, (size_t)cap * sizeof(entry_t));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(e + ix->cap, 0, (size_t)(cap - ix->cap) * sizeof(entry_t));
        ix->e = e, ix->cap = cap;
    }
    size_t nslots = ix->mask + 1;
    uint64_t ndense = ix->ndense, v;
    while (2 * (size_t)(ix->n + 1) + 2 > nslots)
        nslots <<= 1;
    if (number(s, n, &v) && v >= ndense && v < 2 * ndense + 1024)
        ndense = 2 * ndense + 1024;
    if (nslots == ix->mask + 1 && ndense == ix->ndense)
        return 0;
    return retable(ix, nslots, ndense);
}

/* add(payload): see the top of this file. */
static PyObject *index_add(Index *ix, PyObject *payload)
{
    if (!PyBytes_CheckExact(payload))
        return PyErr_Format(PyExc_TypeError, "add(payload): bytes, not %.100s",
                            Py_TYPE(payload)->tp_name);
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(payload);
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    uint64_t hl = size < 8 ? 0 : (uint64_t)p[0] | (uint64_t)p[1] << 8
                                  | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;  /* LE */
    if (size < 8 || hl > (uint64_t)size - 8)
        return bad(ix->n, "not a journal record's payload (u32 head_len, head, u32 0)");
    cur_t c = {p + 4, p + 4 + hl, NULL};
    entry_t one;                    /* read first: nothing changes for a record not held */
    Index probe = *ix;
    probe.e = &one;
    memset(&one, 0, sizeof one);
    if (read_head(&probe, &c, 0)) {
        PyMem_Free(one.sidbuf);
        return NULL;
    }
    if (c.p != c.end || !one.f.plain || one.sid == NULL
            || lookup(ix, one.sid, one.sidn) != NULL || room(ix, one.sid, one.sidn)) {
        PyMem_Free(one.sidbuf);     /* not held */
        if (PyErr_Occurred())
            return NULL;
        if (c.p != c.end)
            return bad(ix->n, "bytes after the head");
        Py_RETURN_FALSE;            /* not plain, or not its step id's first record */
    }
    Py_ssize_t i = ix->n++;
    one.pos = i, one.state = LAZY, one.own = Py_NewRef(payload);
    ix->e[i] = one;
    find_or_add(ix, i);
    ix->live++;
    Py_RETURN_TRUE;
}

static PyMethodDef index_methods[] = {
    {"get", (PyCFunction)(void (*)(void))index_get, METH_FASTCALL,
     "get(sid[, default]): the Lazy tuple of a step id's unfolded record."},
    {"pop", (PyCFunction)(void (*)(void))index_pop, METH_FASTCALL,
     "pop(sid[, default]): get, and the record is no longer unfolded here."},
    {"replay", (PyCFunction)(void (*)(void))index_replay, METH_FASTCALL,
     "replay(sid, name, args, kwargs, version, loads): the recorded result, or MISS."},
    {"add", (PyCFunction)index_add, METH_O,
     "add(payload): hold a live run's new plain STEP record (its COMMIT payload); False: "
     "not held (fold it)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef index_members[] = {
    {"limit", T_PYSSIZET, offsetof(Index, limit), 0,
     "records at or after this log position are not in the index"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods index_seq = {.sq_contains = (objobjproc)index_contains};
static PyMappingMethods index_map = {.mp_length = (lenfunc)index_len};
static PyNumberMethods index_number = {.nb_bool = (inquiry)index_bool};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._journalscan.Index",
    .tp_basicsize = sizeof(Index),
    .tp_dealloc = (destructor)index_dealloc,
    .tp_as_sequence = &index_seq,
    .tp_as_mapping = &index_map,
    .tp_as_number = &index_number,
    .tp_iter = (getiterfunc)index_iter,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A run's plain STEP records by step id, unfolded (see index()).",
    .tp_methods = index_methods,
    .tp_members = index_members,
};

/* ---- run.step's entry: a replayed step and the common new step, in one C call --------- */

/* Run.step (kernel/runtime/run.py) is a StepEntry: a method descriptor (no bound method is
 * made for `run.step(...)`) whose call takes the two hot paths of a run in C and hands
 * every other call to the Python methods, which stay the definition:
 *
 * - any keyword argument, a subclass of Run (its overrides count), or a run whose
 *   automatic step ids are not its one counter (`_plain` false): Run._step, the general
 *   method, as called;
 * - otherwise the automatic id is taken (next(run._n)) and, when the run's index holds a
 *   record of it, Index.replay's answer is returned; on MISS, or for anything below not
 *   as expected, Run._step_at(n, name, fn, args, kwargs) goes on from that id;
 * - a new step (no record of its id, the default serde, inputs of at most `small` bytes):
 *   what _step_at's plan, call and record do, in the same order, to the same record
 *   (Values.encode's bytes and fingerprint, the clock before and after, fn(*args), the
 *   result's bytes, the StepRecord packed and written by the store's own Python methods,
 *   record_step's hold in the index, _seen, InputRefs.recorded) -- a failing call, or a
 *   result the serde refuses, is handed with the plan's fields to Run._new_step_end,
 *   which records and raises as _once does. tests/test_runtime_stepentry.py compares the
 *   records of both paths byte for byte. */

enum { S_PLAIN, S_N, S_ST, S_LAZY, S_ENTRIES, S_VALUES, S_FAST, S_REFS, S_WHOLE,
       S_DUMPS, S_CLOCK, S_STORE, S_RUN_ID, S_PACK, S_WRITE, S_PAYLOAD, S_UPDATED, S_OOO,
       S_SEEN, S_CANON, S_BASES, S_RECORDED, S_STEP, S_RECORD_STEP, S_APPEND, NSTR };
static const char *const snames[NSTR] = {
    "_plain", "_n", "_st", "lazy", "entries", "_values", "_fast", "_refs", "whole",
    "dumps", "_clock", "store", "run_id", "pack_journal", "_write", "payload", "updated",
    "out_of_order", "_seen", "canonical_bytes", "bases", "recorded", "step", "record_step",
    "append_journal"};
static PyObject *S[NSTR];

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *general, *at, *end, *fingerprint, *record_type, *apply_step;
    PyObject *record_step, *globals;    /* journal.record_step, and where run.py names it */
    PyObject *owed;                     /* aio.OWED */
    PyObject *in_call;                  /* plan.IN_CALL */
    PyObject *cls;                      /* Run: a subclass's overrides are honored (general) */
    Py_ssize_t small;
} StepEntry;

/* Whether msgpack bytes may depend on an order: a map of two or more entries, or an
 * extension type (set, frozenset, Enum, ...) -- values.py's `_MAYBE` test, read by the
 * structure instead of by any byte (an int's or a str's bytes are no header). 1 when it
 * cannot tell (malformed): the caller takes the canonical path, which decides. */
static int unordered(cur_t *c, int depth)
{
    size_t hdr;
    uint64_t len;
    int kind = header(c, &hdr, &len);
    if (!kind || depth > MAX_DEPTH || !need(c, hdr) || kind == 'x' || (kind == 'm' && len > 1))
        return 1;
    c->p += hdr;
    if (kind == 'a' || kind == 'm') {
        uint64_t n = kind == 'm' ? 2 * len : len;
        for (uint64_t i = 0; i < n; i++)
            if (unordered(c, depth + 1))
                return 1;
        return 0;
    }
    if (kind == 'o')
        return 0;
    if ((uint64_t)(c->end - c->p) < len)
        return 1;
    c->p += len;
    return 0;
}

/* the replay's keyword arguments: none (read only, never seen by Python code) */
static PyObject *EMPTY;

static PyObject *attr(PyObject *o, int i) { return PyObject_GetAttr(o, S[i]); }

static PyObject *call0(PyObject *f) { return PyObject_CallNoArgs(f); }

/* Whether run._st.entries holds `sid` (-1: error). */
static int has_entry(PyObject *st, PyObject *sid)
{
    PyObject *entries = attr(st, S_ENTRIES);
    if (entries == NULL)
        return -1;
    int r = PyDict_CheckExact(entries) ? PyDict_Contains(entries, sid)
                                       : PySequence_Contains(entries, sid);
    Py_DECREF(entries);
    return r;
}

/* The new step's inputs: (bytes, fingerprint) as Values.encode, or 0 (not this path). */
static int encode_inputs(StepEntry *se, PyObject *values, PyObject *inl, PyObject **whole,
                         PyObject **fp)
{
    PyObject *b = pack_native(inl);
    if (b == NULL && !PyErr_Occurred()) {
        PyObject *dumps = attr(values, S_DUMPS);
        if (dumps == NULL)
            return -1;
        b = PyObject_CallOneArg(dumps, inl);
        Py_DECREF(dumps);
    }
    if (b == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();              /* _step_at raises its SerializationError */
        return 0;
    }
    if (!PyBytes_CheckExact(b) || PyBytes_GET_SIZE(b) > se->small) {
        Py_DECREF(b);
        return 0;
    }
    cur_t c = {(const uint8_t *)PyBytes_AS_STRING(b),
               (const uint8_t *)PyBytes_AS_STRING(b) + PyBytes_GET_SIZE(b), NULL};
    PyObject *canon = Py_NewRef(b);
    if (unordered(&c, 0) || c.p != c.end) {
        Py_DECREF(canon);
        canon = PyObject_CallMethodObjArgs(values, S[S_CANON], inl, b, NULL);
        if (canon == NULL) {
            Py_DECREF(b);
            return -1;
        }
    }
    *fp = PyObject_CallOneArg(se->fingerprint, canon);
    Py_DECREF(canon);
    if (*fp == NULL) {
        Py_DECREF(b);
        return -1;
    }
    *whole = b;
    return 1;
}

/* ---- a new step's record appended from C ----
 *
 * Store.append_journal's one-call path (Writer.append_journal_alone, Appender.write_alone,
 * the backend's and the log's append_one) for the record run.step's entry makes of a new
 * step, without their nine Python frames (~1.5 us of a ~4 us step: docs/BENCHMARKS.md,
 * issue 20). It runs only where that path would run as it stands -- Store._fast_journal
 * set (a local log several processes may share, a policy under which no one waits for the
 * record), no write section open in this process, the store open, compact step ids on (the
 * active segment's flag), no journal results remembered, no index snapshot due, the record
 * packed by csrc/recpack.c within max_commit_bytes -- and does what it does: under the
 * store's lock, dkv_append_one through the log's handle at the index's next LSN (the GIL
 * kept when dkv_append_one_try can, else handed over, as cffi does), then the index's scan_pos, the run's LSN list and the
 * appender's next LSN. Anything else -- or a log that answers other than with an LSN
 * (another process appended: DKV_MOVED; any error) -- takes nothing and appends nothing:
 * the Python methods run as before (and raise the typed error). Nor does it run when
 * the store's pack_journal or append_journal is not Store's own (a subclass's, a wrapper
 * a caller installed): those are called, as ever. */

typedef int64_t (*append_one_fn)(void *log, uint8_t type, const char *buf, uint32_t len,
                                 int durability, uint64_t expect);
/* bound from durkv.log (bind_append): dkv_append_one, and dkv_append_one_try, called first
 * with the GIL held (csrc/heldcall.c says why); only its refusal hands the GIL over */
static append_one_fn append_one, append_one_try;

enum { F_FAST, F_WDEPTH, F_CLOSED, F_STEP_IDS, F_RESULTS, F_ON,
       F_EVERY, F_INDEX_LSN, F_SCAN_POS, F_MAX, F_ADDR, F_NEXT, F_IX, F_ADD, F_E, F_KEYS,
       F_KEEP, F_PACK, F_APPEND, F_JOURNALS, F_APPEND_LSN, NF };
static const char *const fnames[NF] = {
    "_fast_journal", "_wdepth", "_closed", "_step_ids", "results", "on",
    "index_every", "index_lsn", "scan_pos", "max_commit_bytes", "_addr", "next", "ix",
    "add_journal", "E", "KEYS", "KEEP", "pack_journal", "append_journal", "journals",
    "append"};
static PyObject *F[NF];

/* obj.name as a C integer; -1 with an error set, or when not an exact int (then no error:
 * *ok = 0) */
static long long int_attr(PyObject *o, int i, int *ok)
{
    PyObject *v = PyObject_GetAttr(o, F[i]);
    if (v == NULL)
        return -1;
    long long x = -1;
    if (PyLong_CheckExact(v))
        x = PyLong_AsLongLong(v);
    else
        *ok = 0;
    Py_DECREF(v);
    return x;
}

/* 1 when obj.name is True, 0 when anything else, -1 on error */
static int is_true_attr(PyObject *o, int i)
{
    PyObject *v = PyObject_GetAttr(o, F[i]);
    if (v == NULL)
        return -1;
    int t = v == Py_True;
    Py_DECREF(v);
    return t;
}

/* 1 when store.<name> is Store's own method (`original`), not overridden or wrapped --
 * by a subclass, on the class or on the instance: those are called, as the Python path
 * calls them; 0 when not; -1 on error. */
static int own_method(PyObject *store, int name, PyObject *original)
{
    /* the class's (a subclass's override, or a wrapper set on the class, differ), then
     * the instance's own dict; looked up without making a bound method */
    if (_PyType_Lookup(Py_TYPE(store), F[name]) != original)
        return 0;
    PyObject **dict = _PyObject_GetDictPtr(store);
    if (dict == NULL || *dict == NULL)
        return 1;
    if (PyDict_GetItemWithError(*dict, F[name]) != NULL)
        return 0;
    return PyErr_Occurred() ? -1 : 1;
}

/* cls.<name> (new ref): a plain class attribute (no __get__) as the type's cached lookup
 * finds it -- what getattr returns for it, without the metatype's machinery -- else by
 * getattr */
static PyObject *class_attr(PyTypeObject *cls, int name)
{
    PyObject *v = _PyType_Lookup(cls, F[name]);
    if (v != NULL && Py_TYPE(v)->tp_descr_get == NULL
            && _PyType_Lookup(Py_TYPE(cls), F[name]) == NULL)
        return Py_NewRef(v);
    return PyObject_GetAttr((PyObject *)cls, F[name]);
}

/* ix.add_journal(run_id, lsn): a run with LSNs already gets the new one appended to its
 * array here, without the method's Python frame; a run's first, by the method */
static PyObject *add_journal(PyObject *ix, PyObject *run_id, PyObject *lsn)
{
    PyObject *journals = PyObject_GetAttr(ix, F[F_JOURNALS]);
    if (journals == NULL)
        return NULL;
    PyObject *lsns = PyDict_CheckExact(journals) ? PyDict_GetItemWithError(journals, run_id)
                                                 : NULL;
    PyObject *o = lsns != NULL ? PyObject_CallMethodOneArg(lsns, F[F_APPEND_LSN], lsn)
                  : PyErr_Occurred() ? NULL
                  : PyObject_CallMethodObjArgs(ix, F[F_ADD], run_id, lsn, NULL);
    Py_DECREF(journals);
    return o;
}

/* Under the store's lock: the payload appended (new ref), Py_None when not taken, NULL on
 * error. */
static PyObject *fast_append_locked(PyObject *store, PyObject *fast, PyObject *run_id,
                                    PyObject *rec)
{
    PyObject *writer = PyTuple_GET_ITEM(fast, 1), *index = PyTuple_GET_ITEM(fast, 2);
    PyObject *appender = PyTuple_GET_ITEM(fast, 3), *log = PyTuple_GET_ITEM(fast, 4);
    PyObject *pack = PyTuple_GET_ITEM(fast, 7), *kind = PyTuple_GET_ITEM(fast, 8);
    long type = PyLong_AsLong(PyTuple_GET_ITEM(fast, 5));
    long policy = PyLong_AsLong(PyTuple_GET_ITEM(fast, 6));
    if ((type == -1 || policy == -1) && PyErr_Occurred())
        return NULL;
    int ok = 1;
    long long wdepth = int_attr(store, F_WDEPTH, &ok);
    if (wdepth == -1 && PyErr_Occurred())
        return NULL;
    int closed = is_true_attr(store, F_CLOSED), ids = is_true_attr(writer, F_STEP_IDS);
    if (closed < 0 || ids < 0)
        return NULL;
    if (!ok || wdepth != 0 || closed || !ids)
        Py_RETURN_NONE;
    PyObject *results = PyObject_GetAttr(writer, F[F_RESULTS]);
    if (results == NULL)
        return NULL;
    int remembered = is_true_attr(results, F_ON);
    Py_DECREF(results);
    if (remembered)
        return remembered < 0 ? NULL : Py_NewRef(Py_None);
    long long every = int_attr(index, F_EVERY, &ok), at = int_attr(index, F_INDEX_LSN, &ok);
    long long pos = int_attr(index, F_SCAN_POS, &ok);
    long long max = int_attr(appender, F_MAX, &ok), addr = int_attr(log, F_ADDR, &ok);
    if (PyErr_Occurred())
        return NULL;
    if (!ok || pos < 0 || (every && pos - at >= every))
        Py_RETURN_NONE;
    /* Writer.pack_journal's C call for a typed record */
    PyTypeObject *cls = Py_TYPE(rec);
    PyObject *e = class_attr(cls, F_E);
    PyObject *keys = e ? class_attr(cls, F_KEYS) : NULL;
    PyObject *keep = keys ? class_attr(cls, F_KEEP) : NULL;
    PyObject *payload = NULL;
    if (keep != NULL) {
        PyObject *a[7] = {kind, run_id, rec, e, keys, keep, Py_True};
        payload = PyObject_Vectorcall(pack, a, 7, NULL);
    }
    Py_XDECREF(e);
    Py_XDECREF(keys);
    Py_XDECREF(keep);
    if (payload == NULL)
        return NULL;
    if (!PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) > max
            || (uint64_t)PyBytes_GET_SIZE(payload) > UINT32_MAX)
        return Py_DECREF(payload), Py_NewRef(Py_None);   /* the Python path's case */
    const char *buf = PyBytes_AS_STRING(payload);
    uint32_t len = (uint32_t)PyBytes_GET_SIZE(payload);
    int64_t lsn = append_one_try((void *)(uintptr_t)addr, (uint8_t)type, buf, len, (int)policy,
                                 (uint64_t)pos);
    if (lsn == DKV_WOULD_WAIT) {
        Py_BEGIN_ALLOW_THREADS
        lsn = append_one((void *)(uintptr_t)addr, (uint8_t)type, buf, len, (int)policy,
                         (uint64_t)pos);
        Py_END_ALLOW_THREADS
    }
    if (lsn < 0)
        return Py_DECREF(payload), Py_NewRef(Py_None);
    /* write_alone's and append_journal_alone's bookkeeping */
    PyObject *end = PyLong_FromLongLong(lsn + 1), *at_lsn = PyLong_FromLongLong(lsn);
    PyObject *ix = end && at_lsn ? PyObject_GetAttr(index, F[F_IX]) : NULL;
    PyObject *o = NULL;
    if (ix != NULL && !PyObject_SetAttr(appender, F[F_NEXT], end)
            && !PyObject_SetAttr(index, F[F_SCAN_POS], end))
        o = add_journal(ix, run_id, at_lsn);
    Py_XDECREF(end);
    Py_XDECREF(at_lsn);
    Py_XDECREF(ix);
    if (o == NULL) {
        Py_DECREF(payload);
        return NULL;
    }
    Py_DECREF(o);
    return payload;
}

/* The record `rec` of a new step appended from C (see above): its payload, Py_None when
 * not taken (nothing appended), NULL on error. */
static PyObject *fast_append(PyObject *store, PyObject *run_id, PyObject *rec)
{
    if (append_one == NULL || !PyUnicode_CheckExact(run_id))
        Py_RETURN_NONE;
    PyObject *fast = PyObject_GetAttr(store, F[F_FAST]);
    if (fast == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();      /* not a Store: its own methods */
        Py_RETURN_NONE;
    }
    if (!PyTuple_CheckExact(fast) || PyTuple_GET_SIZE(fast) != 12) {
        Py_DECREF(fast);
        Py_RETURN_NONE;
    }
    int own = own_method(store, F_PACK, PyTuple_GET_ITEM(fast, 9));
    if (own == 1)
        own = own_method(store, F_APPEND, PyTuple_GET_ITEM(fast, 10));
    if (own != 1) {
        Py_DECREF(fast);
        return own < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *got = call0(PyTuple_GET_ITEM(fast, 0));     /* the store's lock.acquire */
    if (got == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
    Py_DECREF(got);
    PyObject *out = fast_append_locked(store, fast, run_id, rec);
    /* released whatever happened, an error kept across the call */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = call0(PyTuple_GET_ITEM(fast, 11));      /* ... and its release */
    Py_DECREF(fast);
    if (r == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(out);
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
    return out;
}

/* bind_append((one, one_try)): dkv_append_one's and dkv_append_one_try's addresses, from
 * durkv.log */
static PyObject *bind_append(PyObject *self, PyObject *addrs)
{
    (void)self;
    void *f[2];
    if (!PyTuple_CheckExact(addrs) || PyTuple_GET_SIZE(addrs) != 2) {
        PyErr_SetString(PyExc_TypeError, "bind_append((dkv_append_one, dkv_append_one_try))");
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        f[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addrs, i));
        if (f[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a log function's address is not 0");
            return NULL;
        }
    }
    append_one = (append_one_fn)(uintptr_t)f[0];
    append_one_try = (append_one_fn)(uintptr_t)f[1];
    Py_RETURN_NONE;
}

/* The record of a new step that returned `value` (its bytes `r`): _record_step's, after
 * _outcome_fields. */
/* tuple.__new__(record_type, items) without a tuple of the fields in between: what
 * tuple's own __new__ does for a subclass (tp_alloc of n items, each a new reference) */
static PyObject *new_record(StepEntry *se, PyObject *const *items, Py_ssize_t n)
{
    PyTypeObject *t = (PyTypeObject *)se->record_type;
    PyObject *rec = t->tp_alloc(t, n);
    for (Py_ssize_t i = 0; rec != NULL && i < n; i++)
        PyTuple_SET_ITEM(rec, i, Py_NewRef(items[i]));
    return rec;
}

static int record_new(StepEntry *se, PyObject *run, PyObject *clock, PyObject *refs,
                      PyObject *sid, PyObject *name, PyObject *fp, PyObject *whole,
                      PyObject *t0, PyObject *r)
{
    PyObject *t = call0(clock);
    if (t == NULL)
        return -1;
    PyObject *tries = PyList_New(0), *zero = PyLong_FromLong(0);
    PyObject *rec = NULL, *store = NULL, *run_id = NULL, *packed = NULL, *payload = NULL,
             *st = NULL, *lazy = NULL, *o = NULL;
    int ok = -1;
    if (tries != NULL && zero != NULL) {
        PyObject *fields[13] = {t, sid, S[S_STEP], name, fp, t0, zero, whole, Py_None, tries,
                                Py_None, r, Py_None};
        rec = new_record(se, fields, 13);
    }
    Py_XDECREF(tries);
    Py_XDECREF(zero);
    if (rec == NULL || (store = attr(run, S_STORE)) == NULL
            || (run_id = attr(run, S_RUN_ID)) == NULL)
        goto done;
    PyObject *owed;
    if (PyContextVar_Get(se->owed, NULL, &owed) < 0)
        goto done;
    /* a sync verb's record, appended here where Store.append_journal's one-call path would
     * take it (fast_append); else Run._write(packed): appended as the policy says (an
     * async verb's owes its fsync to its coroutine: _write decides) */
    payload = owed == Py_None ? fast_append(store, run_id, rec) : Py_NewRef(Py_None);
    if (payload == Py_None) {
        Py_CLEAR(payload);
        packed = PyObject_CallMethodObjArgs(store, S[S_PACK], run_id, rec, NULL);
        o = packed == NULL ? NULL
            : owed == Py_None ? PyObject_CallMethodObjArgs(store, S[S_APPEND], run_id, packed, NULL)
            : PyObject_CallMethodOneArg(run, S[S_WRITE], packed);
        if (o != NULL) {
            Py_CLEAR(o);
            payload = attr(packed, S_PAYLOAD);
        }
    }
    Py_DECREF(owed);
    /* journal.record_step */
    if (payload == NULL || (st = attr(run, S_ST)) == NULL || (lazy = attr(st, S_LAZY)) == NULL)
        goto done;
    int held = 0;
    PyObject *rs = PyDict_GetItemWithError(se->globals, S[S_RECORD_STEP]);
    if (rs != se->record_step) {    /* replaced (a test's eager fold): call it */
        PyObject *a[3] = {st, rec, payload};
        if (rs == NULL || (o = PyObject_Vectorcall(rs, a, 3, NULL)) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_NameError, "record_step");
            goto done;
        }
        Py_CLEAR(o);
    } else if (Py_IS_TYPE(lazy, &IndexType)) {
        int has = has_entry(st, sid);
        if (has < 0)
            goto done;
        if (!has) {
            if ((o = index_add((Index *)lazy, payload)) == NULL)
                goto done;
            held = o == Py_True;
            Py_CLEAR(o);
        }
    }
    if (held) {
        if (PyObject_SetAttr(st, S[S_UPDATED], t) || PyObject_SetAttr(st, S[S_OOO], Py_True))
            goto done;
    } else if (rs == se->record_step) {
        PyObject *a[2] = {st, rec};
        if ((o = PyObject_Vectorcall(se->apply_step, a, 2, NULL)) == NULL)
            goto done;
        Py_CLEAR(o);
    }
    /* run._seen += 1 */
    PyObject *seen = attr(run, S_SEEN);
    if (seen == NULL)
        goto done;
    PyObject *one = PyLong_FromLong(1);
    o = one ? PyNumber_Add(seen, one) : NULL;
    Py_DECREF(seen);
    Py_XDECREF(one);
    if (o == NULL || PyObject_SetAttr(run, S[S_SEEN], o))
        goto done;
    Py_CLEAR(o);
    /* run._refs.recorded(sid, 0, "step", name, (whole, None, fp, None), r): a no-op while
     * no base is held (inputs.py) */
    PyObject *bases = attr(refs, S_BASES);
    if (bases == NULL)
        goto done;
    int empty = PyDict_CheckExact(bases) && PyDict_GET_SIZE(bases) == 0;
    Py_DECREF(bases);
    if (!empty) {
        PyObject *zero2 = PyLong_FromLong(0);
        PyObject *enc = PyTuple_Pack(4, whole, Py_None, fp, Py_None);
        o = zero2 && enc ? PyObject_CallMethodObjArgs(refs, S[S_RECORDED], sid, zero2,
                                                      S[S_STEP], name, enc, r, NULL) : NULL;
        Py_XDECREF(zero2);
        Py_XDECREF(enc);
        if (o == NULL)
            goto done;
        Py_CLEAR(o);
    }
    ok = 0;
done:
    Py_XDECREF(o);
    Py_XDECREF(lazy);
    Py_XDECREF(st);
    Py_XDECREF(payload);
    Py_XDECREF(packed);
    Py_XDECREF(run_id);
    Py_XDECREF(store);
    Py_XDECREF(rec);
    Py_DECREF(t);
    return ok;
}

/* fn(*argv) as a durable call of `run` (plan.call_in): plan.IN_CALL holds [run, None]
 * meanwhile (new_step runs only outside every durable call); when a durable call of the
 * same run was refused inside fn (plan.not_nested appended its refusal), that refusal is
 * raised whatever fn returned or raised (*refused set), and the caller records nothing. */
static PyObject *call_in(StepEntry *se, PyObject *run, PyObject *fn, PyObject *const *argv,
                         Py_ssize_t argc, int *refused)
{
    PyObject *cell = PyList_New(2);
    if (cell == NULL)
        return NULL;
    PyList_SET_ITEM(cell, 0, Py_NewRef(run));
    PyList_SET_ITEM(cell, 1, Py_NewRef(Py_None));
    PyObject *tok = PyContextVar_Set(se->in_call, cell);
    if (tok == NULL) {
        Py_DECREF(cell);
        return NULL;
    }
    PyObject *value = PyObject_Vectorcall(fn, argv, (size_t)argc, NULL);
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    int reset = PyContextVar_Reset(se->in_call, tok);
    Py_DECREF(tok);
    PyObject *nested = reset < 0 ? NULL : Py_NewRef(PyList_GET_SIZE(cell) > 2
                                                    ? PyList_GET_ITEM(cell, 2) : Py_None);
    Py_DECREF(cell);
    if (nested == NULL || nested != Py_None) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        Py_CLEAR(value);
        *refused = 1;       /* (or the reset failed): raised as it is, nothing recorded */
        if (nested != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(nested), nested);
            Py_DECREF(nested);
        }
        return NULL;
    }
    Py_DECREF(nested);
    PyErr_Restore(et, ev, etb);
    return value;
}

/* A new step of id `sid` (no record of it anywhere): NULL with *declined set when it is
 * not this path's (nothing done yet). */
static PyObject *new_step(StepEntry *se, PyObject *run, PyObject *sid, PyObject *name,
                          PyObject *fn, PyObject *const *argv, Py_ssize_t argc,
                          PyObject *kwargs, int *declined)
{
    PyObject *values = attr(run, S_VALUES);
    if (values == NULL)
        return NULL;
    PyObject *fast = attr(values, S_FAST), *refs = NULL, *whole = NULL, *fp = NULL;
    PyObject *inl = NULL, *al = NULL, *value = NULL, *clock = NULL, *t0 = NULL;
    int is_fast = fast == Py_True;
    Py_XDECREF(fast);
    if (fast == NULL)
        goto fail;
    if (!is_fast)
        goto decline;
    PyObject *cur;
    if (PyContextVar_Get(se->in_call, NULL, &cur) < 0)
        goto fail;
    int inside = cur != Py_None;
    Py_DECREF(cur);
    if (inside)             /* inside a durable call's function: Run._plan_call decides */
        goto decline;       /* (a call of the same run is refused there) */
    if ((refs = attr(run, S_REFS)) == NULL)
        goto fail;
    PyObject *w = attr(refs, S_WHOLE);     /* InputRefs.encode's hot path: the default serde */
    if (w == NULL)
        goto fail;
    int whole_ok = w != Py_None;
    Py_DECREF(w);
    if (!whole_ok)
        goto decline;
    if ((al = PyList_New(argc)) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < argc; i++)
        PyList_SET_ITEM(al, i, Py_NewRef(argv[i]));
    if ((inl = PyList_New(2)) == NULL)
        goto fail;
    PyList_SET_ITEM(inl, 0, al);
    PyList_SET_ITEM(inl, 1, Py_NewRef(kwargs));
    al = NULL;
    int enc = encode_inputs(se, values, inl, &whole, &fp);
    if (enc < 0)
        goto fail;
    if (enc == 0)
        goto decline;
    if ((clock = attr(run, S_CLOCK)) == NULL || (t0 = call0(clock)) == NULL)   /* _plan_step */
        goto fail;
    int refused = 0;
    value = call_in(se, run, fn, argv, argc, &refused);
    if (refused)
        goto fail;
    PyObject *exc = NULL, *r = NULL;
    if (value == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto fail;              /* _once lets it through, unrecorded */
        PyObject *et, *tb;
        PyErr_Fetch(&et, &exc, &tb);
        PyErr_NormalizeException(&et, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        Py_XDECREF(et);
        Py_XDECREF(tb);
    } else {
        r = pack_native(value);
        if (r == NULL && !PyErr_Occurred()) {
            PyObject *dumps = attr(values, S_DUMPS);
            if (dumps == NULL)
                goto fail;
            r = PyObject_CallOneArg(dumps, value);
            Py_DECREF(dumps);
        }
        if (r == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                goto fail;
            PyErr_Clear();          /* _new_step_end raises _outcome_fields' error */
        }
    }
    if (r == NULL) {                /* a failure, or a result refused: the Python path's */
        PyObject *a[8] = {run, sid, name, fp, whole, t0, value ? value : Py_None,
                          exc ? exc : Py_None};
        PyObject *o = PyObject_Vectorcall(se->end, a, 8, NULL);
        Py_XDECREF(exc);
        Py_XDECREF(o);
        Py_CLEAR(value);
        if (o != NULL) {
            value = Py_NewRef(o);   /* not reached: _new_step_end raises */
            Py_DECREF(o);
            goto out;
        }
        goto fail;
    }
    int rc = record_new(se, run, clock, refs, sid, name, fp, whole, t0, r);
    Py_DECREF(r);
    if (rc)
        goto fail;
out:
    Py_DECREF(values);
    Py_XDECREF(refs);
    Py_XDECREF(whole);
    Py_XDECREF(fp);
    Py_XDECREF(inl);
    Py_XDECREF(clock);
    Py_XDECREF(t0);
    return value;
decline:
    *declined = 1;
fail:
    Py_CLEAR(value);
    Py_XDECREF(al);
    goto out;
}

static PyObject *step_call(StepEntry *se, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* a name that is not a str (or not text UTF-8 holds: a lone surrogate) or an fn that
     * is not callable: the definition refuses it. (A str caches its UTF-8: one encode.) */
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs < 3
            || !Py_IS_TYPE(args[0], (PyTypeObject *)se->cls) || !PyUnicode_CheckExact(args[1])
            || !PyCallable_Check(args[2]))
        return PyObject_Vectorcall(se->general, args, nargsf, kwnames);
    if (!PyUnicode_IS_ASCII(args[1]) && PyUnicode_AsUTF8AndSize(args[1], NULL) == NULL) {
        PyErr_Clear();
        return PyObject_Vectorcall(se->general, args, nargsf, kwnames);
    }
    PyObject *run = args[0], *name = args[1], *fn = args[2];
    PyObject *plain = attr(run, S_PLAIN);
    if (plain == NULL)
        return NULL;
    Py_DECREF(plain);
    if (plain != Py_True)
        return PyObject_Vectorcall(se->general, args, nargsf, kwnames);
    PyObject *counter = attr(run, S_N);
    if (counter == NULL)
        return NULL;
    PyObject *n = PyIter_Next(counter);
    Py_DECREF(counter);
    if (n == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_RuntimeError, "run._n ended");
    PyObject *argt = PyTuple_New(nargs - 3), *kwargs = NULL;   /* made when Python needs it */
    for (Py_ssize_t i = 3; argt != NULL && i < nargs; i++)
        PyTuple_SET_ITEM(argt, i - 3, Py_NewRef(args[i]));
    PyObject *st = NULL, *lazy = NULL, *sid = NULL, *out = NULL;
    if (argt == NULL || (st = attr(run, S_ST)) == NULL
            || (lazy = attr(st, S_LAZY)) == NULL)
        goto done;
    if (Py_IS_TYPE(lazy, &IndexType)) {
        Index *ix = (Index *)lazy;
        entry_t *e = lazy_of(ix, n, 1);
        if (e != NULL) {            /* a record of this id: a replay, or the Python path */
            PyObject *a[6] = {run, name, argt, EMPTY, Py_None, NULL};   /* loads: run's */
            out = replay_entry(ix, e, a + 1);
            if (out != MISS)
                goto done;
            Py_CLEAR(out);
            goto general;
        }
    } else {
        int full = PyObject_IsTrue(lazy);
        if (full < 0)
            goto done;
        if (full)
            goto general;
    }
    if (!PyLong_CheckExact(n) || (sid = PyObject_Str(n)) == NULL)
        goto general_or_error;
    int has = has_entry(st, sid);
    if (has < 0)
        goto done;
    if (has)
        goto general;
    int declined = 0;
    if ((kwargs = PyDict_New()) == NULL)
        goto done;
    out = new_step(se, run, sid, name, fn, args + 3, nargs - 3, kwargs, &declined);
    if (out == NULL && declined)
        goto general;
    goto done;
general_or_error:
    if (PyErr_Occurred())
        goto done;
general:
    if (kwargs == NULL && (kwargs = PyDict_New()) == NULL)
        goto done;
    PyObject *a[6] = {run, n, name, fn, argt, kwargs};
    out = PyObject_Vectorcall(se->at, a, 6, NULL);
done:
    Py_DECREF(n);
    Py_XDECREF(argt);
    Py_XDECREF(kwargs);
    Py_XDECREF(st);
    Py_XDECREF(lazy);
    Py_XDECREF(sid);
    return out;
}

static PyObject *step_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"general", "at", "end", "fingerprint", "record_type",
                             "apply_step", "record_step", "globals", "owed", "cls", "small",
                             "in_call", NULL};
    PyObject *g, *at, *end, *fp, *rt, *ap, *rs, *gl, *ow, *cls, *ic;
    Py_ssize_t small;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO!OOO!O!O!nO!", kwlist, &g, &at, &end,
                                     &fp, &PyType_Type, &rt, &ap, &rs, &PyDict_Type, &gl,
                                     &PyContextVar_Type, &ow, &PyType_Type, &cls, &small,
                                     &PyContextVar_Type, &ic))
        return NULL;
    /* new_record allocates it as tuple.__new__ does */
    if (!PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type))
        return PyErr_Format(PyExc_TypeError, "record_type: a tuple subclass (a NamedTuple), "
                            "not %R", rt);
    StepEntry *se = (StepEntry *)type->tp_alloc(type, 0);
    if (se == NULL)
        return NULL;
    se->vectorcall = (vectorcallfunc)step_call;
    se->general = Py_NewRef(g), se->at = Py_NewRef(at), se->end = Py_NewRef(end);
    se->fingerprint = Py_NewRef(fp), se->record_type = Py_NewRef(rt);
    se->apply_step = Py_NewRef(ap), se->record_step = Py_NewRef(rs);
    se->globals = Py_NewRef(gl), se->owed = Py_NewRef(ow), se->cls = Py_NewRef(cls);
    se->in_call = Py_NewRef(ic);
    se->small = small;
    return (PyObject *)se;
}

static int step_clear(StepEntry *se)
{
    Py_CLEAR(se->general);
    Py_CLEAR(se->at);
    Py_CLEAR(se->end);
    Py_CLEAR(se->fingerprint);
    Py_CLEAR(se->record_type);
    Py_CLEAR(se->apply_step);
    Py_CLEAR(se->record_step);
    Py_CLEAR(se->globals);
    Py_CLEAR(se->owed);
    Py_CLEAR(se->cls);
    Py_CLEAR(se->in_call);
    return 0;
}

static int step_traverse(StepEntry *se, visitproc visit, void *arg)
{
    Py_VISIT(se->general);
    Py_VISIT(se->at);
    Py_VISIT(se->end);
    Py_VISIT(se->fingerprint);
    Py_VISIT(se->record_type);
    Py_VISIT(se->apply_step);
    Py_VISIT(se->record_step);
    Py_VISIT(se->globals);
    Py_VISIT(se->owed);
    Py_VISIT(se->cls);
    Py_VISIT(se->in_call);
    return 0;
}

static void step_dealloc(StepEntry *se)
{
    PyObject_GC_UnTrack(se);
    step_clear(se);
    Py_TYPE(se)->tp_free((PyObject *)se);
}

/* run.step: a bound method (as for a function); Run.step: the entry itself. */
static PyObject *step_get(PyObject *se, PyObject *obj, PyObject *type)
{
    (void)type;     /* tp_descr_get's signature */
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(se);
    return PyMethod_New(se, obj);
}

/* help() and inspect read the general method's. */
static PyObject *step_getattro(StepEntry *se, PyObject *name)
{
    PyObject *o = PyObject_GenericGetAttr((PyObject *)se, name);
    if (o != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return o;
    PyErr_Clear();
    return PyObject_GetAttr(se->general, name);
}

static PyObject *step_doc(StepEntry *se, void *closure)
{
    (void)closure;  /* a getter's signature */
    return PyObject_GetAttrString(se->general, "__doc__");
}

static PyGetSetDef step_getset[] = {
    {"__doc__", (getter)step_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef step_members[] = {
    {"general", T_OBJECT, offsetof(StepEntry, general), READONLY,
     "Run._step: the general path, the definition of every call"},
    {"__wrapped__", T_OBJECT, offsetof(StepEntry, general), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._journalscan.StepEntry",
    .tp_basicsize = sizeof(StepEntry),
    .tp_dealloc = (destructor)step_dealloc,
    .tp_vectorcall_offset = offsetof(StepEntry, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = (getattrofunc)step_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "run.step's entry: a replayed step and the common new step in C (see above).",
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_members = step_members,
    .tp_getset = step_getset,
    .tp_descr_get = step_get,
    .tp_new = step_new,
};

static PyMethodDef methods[] = {
    {"index", index_heads, METH_O,
     "index(heads) -> (lazy, rest, where, last): a run's journal heads, read for a replay."},
    {"bind_append", bind_append, METH_O,
     "bind_append((one, one_try)): dkv_append_one's and dkv_append_one_try's addresses, "
     "for run.step's own appends (durkv.log)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._journalscan",
    "A run's journal records read for a replay (csrc/journalscan.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__journalscan(void)
{
    if (PyType_Ready(&IndexType) < 0 || PyType_Ready(&StepEntryType) < 0)
        return NULL;
    if ((EMPTY = PyDict_New()) == NULL)
        return NULL;
    for (int i = 0; i < NSTR; i++)
        if ((S[i] = PyUnicode_InternFromString(snames[i])) == NULL)
            return NULL;
    for (int i = 0; i < NF; i++)
        if ((F[i] = PyUnicode_InternFromString(fnames[i])) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    MISS = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (MISS == NULL || PyModule_AddObjectRef(m, "MISS", MISS) < 0
            || PyModule_AddObjectRef(m, "Index", (PyObject *)&IndexType) < 0
            || PyModule_AddObjectRef(m, "StepEntry", (PyObject *)&StepEntryType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
