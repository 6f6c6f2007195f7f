/* durkv._recpack: a journal record's frame payload packed in one C call.
 *
 * A journal record reaches the log as a COMMIT payload with no entries (docs/FORMAT.md 5,
 * 5a): u32 head_len, the head -- msgpack [kind, run_id, map] --, u32 0. The Python path
 * builds the map from a typed record (durkv.runtime.records: X.pack(), one dict), packs
 * the head with msgpack.Packer(use_bin_type=True) and frames it (payload.encode_record):
 * ~12 us of interpreter work on every new step. journal_payload() writes the same bytes
 * from the record's fields in one pass:
 *
 *   journal_payload(kind, run_id, fields, e, keys, keep, ids) -> bytes | None
 *   journal_payload(kind, run_id, map, ids) -> bytes | None     (a record given as its map)
 *
 * fields: the record as a tuple (a NamedTuple of durkv.runtime.records); e: its event;
 * keys: each field's key on disk; keep: when a field is written -- 0 always, 1 unless None,
 * 2 unless false (records.ALWAYS, SET, TRUE): X.pack()'s rule, the map's keys in the same
 * order ("e" first). ids: true when the log's active segment has flag STEP_IDS: a str value
 * of the map (at any depth, never a key) that is a step id of the form UUID:N is written as
 * its compact extension (docs/FORMAT.md 5a; durkv.store.stepids.with_step_ids is the same
 * rule for the Python path).
 *
 * Values are encoded as msgpack-python's Packer(use_bin_type=True) encodes them: None,
 * bool, int (the smallest form; -2^63..2^64-1), float (float 64), str (fixstr/str8/16/32,
 * UTF-8), bytes (bin8/16/32), list and tuple (arrays), dict (maps, in insertion order),
 * each of exactly that type. Anything else -- a subclass, another type, an int out of
 * range, a str that is not UTF-8 encodable, a nesting deeper than MAX_DEPTH -- answers
 * None: the caller takes the Python path, which encodes it or raises what msgpack raises.
 * So this file decides only how fast a record is packed, never what its bytes are;
 * tests/test_recpack.py holds it to the Python path byte for byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 500       /* msgpack-python refuses deeper than 511 */
#define FALLBACK 1          /* pack() results: 0 ok, FALLBACK, -1 a Python error set */

static PyObject *small[3];  /* the ints 0, 1, 2 (CPython's cached objects): KEEP's rules */

typedef struct {
    char *p;
    size_t n, cap;
    char small[1024];
} buf_t;

static int grow(buf_t *b, size_t more)
{
    size_t cap = b->cap * 2;
    while (cap < b->n + more)
        cap *= 2;
    char *q;
    if (b->p == b->small) {
        q = PyMem_Malloc(cap);
        if (q != NULL)
            memcpy(q, b->p, b->n);
    } else {
        q = PyMem_Realloc(b->p, cap);
    }
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

/* room for n more bytes: the one capacity check of each value's writes */
static inline int room(buf_t *b, size_t n)
{
    return b->n + n <= b->cap ? 0 : grow(b, n);
}

static inline int put(buf_t *b, const void *src, size_t n)
{
    if (room(b, n) < 0)
        return -1;
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}

static inline int put1(buf_t *b, uint8_t c)
{
    if (room(b, 1) < 0)
        return -1;
    b->p[b->n++] = (char)c;
    return 0;
}

/* a type byte then an n-byte big-endian number */
static inline int put_be(buf_t *b, uint8_t type, uint64_t v, int n)
{
    if (room(b, 9) < 0)
        return -1;
    uint8_t *w = (uint8_t *)b->p + b->n;
    w[0] = type;
    for (int i = n; i >= 1; i--, v >>= 8)
        w[i] = (uint8_t)(v & 0xff);
    b->n += (size_t)n + 1;
    return 0;
}

/* the header of a str/bin/array/map of n (fix: the fix form's base byte and limit, 0 none) */
static inline int put_len(buf_t *b, size_t n, uint8_t fix, size_t fixmax, uint8_t t8,
                          uint8_t t16, uint8_t t32)
{
    if (fix && n <= fixmax)
        return put1(b, (uint8_t)(fix | n));
    if (t8 && n <= 0xff)
        return put_be(b, t8, n, 1);
    if (n <= 0xffff)
        return put_be(b, t16, n, 2);
    return put_be(b, t32, n, 4);
}

static int put_int(buf_t *b, PyObject *o)
{
    if (o == small[0] || o == small[1] || o == small[2])    /* gen 0, E_STEP... */
        return put1(b, (uint8_t)(o == small[0] ? 0 : o == small[1] ? 1 : 2));
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0)
        return FALLBACK;
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return FALLBACK;      /* >= 2^64: msgpack raises OverflowError */
        }
        return put_be(b, 0xcf, u, 8);
    }
    if (v >= 0) {
        if (v < 0x80)
            return put1(b, (uint8_t)v);
        if (v <= 0xff)
            return put_be(b, 0xcc, (uint64_t)v, 1);
        if (v <= 0xffff)
            return put_be(b, 0xcd, (uint64_t)v, 2);
        if (v <= 0xffffffffLL)
            return put_be(b, 0xce, (uint64_t)v, 4);
        return put_be(b, 0xcf, (uint64_t)v, 8);
    }
    if (v >= -32)
        return put1(b, (uint8_t)(int8_t)v);
    if (v >= -128)
        return put_be(b, 0xd0, (uint64_t)v, 1);
    if (v >= -32768)
        return put_be(b, 0xd1, (uint64_t)v, 2);
    if (v >= -2147483648LL)
        return put_be(b, 0xd2, (uint64_t)v, 4);
    return put_be(b, 0xd3, (uint64_t)v, 8);
}

static int put_str(buf_t *b, PyObject *o)
{
    Py_ssize_t n;
    const char *s;
    if (PyUnicode_IS_COMPACT_ASCII(o)) {   /* keys, step ids, names: ASCII is its UTF-8 */
        n = PyUnicode_GET_LENGTH(o);
        s = (const char *)PyUnicode_DATA(o);
    } else {
        s = PyUnicode_AsUTF8AndSize(o, &n);
    }
    if (s == NULL) {
        PyErr_Clear();      /* a lone surrogate: msgpack's own error, on the Python path */
        return FALLBACK;
    }
    if ((size_t)n > 0xffffffffu)
        return FALLBACK;
    if (put_len(b, (size_t)n, 0xa0, 31, 0xd9, 0xda, 0xdb) < 0)
        return -1;
    return put(b, s, (size_t)n);
}

/* A compact step id (FORMAT.md 5a): when s[0..n) is "U:N" -- U a canonical lowercase
 * UUID, N decimal below 2^64 with no leading zero --, the extension's data (the UUID's 16
 * bytes, N big-endian in the fewest bytes, none for 0) in out; returns its length, else 0. */
static size_t step_id_data(const char *s, size_t n, uint8_t out[24])
{
    if (n < 38 || n > 57 || s[36] != ':')
        return 0;
    size_t o = 0;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return 0;
            continue;
        }
        int c = s[i], v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                                                : -1;
        if (v < 0)
            return 0;
        if (o & 1)
            out[o++ / 2] |= (uint8_t)v;
        else
            out[o++ / 2] = (uint8_t)(v << 4);
    }
    if (n > 38 && s[37] == '0')
        return 0;
    uint64_t v = 0;
    for (size_t i = 37; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    size_t k = 0;
    for (uint64_t x = v; x; x >>= 8)
        k++;
    for (size_t i = 0; i < k; i++)
        out[16 + i] = (uint8_t)(v >> (8 * (k - 1 - i)));
    return 16 + k;
}

/* A str value: its compact step id form when ids is set and it has one, else the str. */
static int put_value_str(buf_t *b, PyObject *o, int ids)
{
    if (ids && PyUnicode_IS_COMPACT_ASCII(o)) {
        uint8_t data[24];
        size_t n = step_id_data((const char *)PyUnicode_DATA(o), (size_t)PyUnicode_GET_LENGTH(o),
                                data);
        if (n) {
            uint8_t h[2] = {0xc7, (uint8_t)n};           /* ext 8: its length */
            int r = n == 16 ? put1(b, 0xd8) : put(b, h, 2);   /* fixext 16 */
            if (!r)
                r = put1(b, 1);                         /* the extension type */
            return r ? r : put(b, data, n);
        }
    }
    return put_str(b, o);
}

static int pack(buf_t *b, PyObject *o, int depth, int ids)
{
    if (depth > MAX_DEPTH)
        return FALLBACK;
    if (o == Py_None)
        return put1(b, 0xc0);
    if (o == Py_True || o == Py_False)
        return put1(b, o == Py_True ? 0xc3 : 0xc2);
    if (PyLong_CheckExact(o))
        return put_int(b, o);
    if (PyUnicode_CheckExact(o))
        return put_value_str(b, o, ids);
    if (PyBytes_CheckExact(o)) {
        size_t n = (size_t)PyBytes_GET_SIZE(o);
        if (n > 0xffffffffu)
            return FALLBACK;
        if (put_len(b, n, 0, 0, 0xc4, 0xc5, 0xc6) < 0)
            return -1;
        return put(b, PyBytes_AS_STRING(o), n);
    }
    if (PyFloat_CheckExact(o)) {
        double d = PyFloat_AS_DOUBLE(o);
        uint64_t u;
        memcpy(&u, &d, 8);
        return put_be(b, 0xcb, u, 8);
    }
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        /* nothing here runs Python code: the list cannot change while it is walked */
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        PyObject **items = PySequence_Fast_ITEMS(o);
        if ((size_t)n > 0xffffffffu)
            return FALLBACK;
        if (put_len(b, (size_t)n, 0x90, 15, 0, 0xdc, 0xdd) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = pack(b, items[i], depth + 1, ids);
            if (r)
                return r;
        }
        return 0;
    }
    if (PyDict_CheckExact(o)) {
        Py_ssize_t n = PyDict_GET_SIZE(o), pos = 0;
        PyObject *k, *v;
        if ((size_t)n > 0xffffffffu)
            return FALLBACK;
        if (put_len(b, (size_t)n, 0x80, 15, 0, 0xde, 0xdf) < 0)
            return -1;
        while (PyDict_Next(o, &pos, &k, &v)) {
            int r = pack(b, k, depth + 1, 0);     /* a key is never a compact id */
            if (!r)
                r = pack(b, v, depth + 1, ids);
            if (r)
                return r;
        }
        return 0;
    }
    return FALLBACK;
}

/* the record's map: "e" then each kept field, as X.pack() builds it */
static int pack_map(buf_t *b, PyObject *fields, long e, PyObject *keys, PyObject *keep, int ids)
{
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    uint8_t kept[64];
    size_t count = 1;
    if (n > 64)
        return FALLBACK;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(fields, i), *k = PyTuple_GET_ITEM(keep, i);
        long rule = k == small[0] ? 0 : k == small[1] ? 1 : k == small[2] ? 2 : PyLong_AsLong(k);
        int yes;
        if (rule == -1 && PyErr_Occurred())
            return -1;
        if (rule == 0)
            yes = 1;
        else if (rule == 1)
            yes = v != Py_None;
        else if (rule == 2) {
            if (v == Py_None || v == Py_False)
                yes = 0;
            else if (v == Py_True)
                yes = 1;
            else if (PyLong_CheckExact(v) || PyList_CheckExact(v) || PyTuple_CheckExact(v)
                     || PyUnicode_CheckExact(v) || PyBytes_CheckExact(v)
                     || PyDict_CheckExact(v) || PyFloat_CheckExact(v))
                yes = PyObject_IsTrue(v);   /* builtins: no Python code runs */
            else
                return FALLBACK;            /* a __bool__ of its own: the Python path */
        } else {
            return FALLBACK;
        }
        kept[i] = (uint8_t)yes;
        count += (size_t)yes;
    }
    if (put_len(b, count, 0x80, 15, 0, 0xde, 0xdf) < 0)
        return -1;
    uint8_t ekey[2] = {0xa1, 'e'};
    if (put(b, ekey, 2) < 0)
        return -1;
    if (e < 0 || e > 0x7f)      /* an event is a positive fixint (FORMAT.md 5a) */
        return FALLBACK;
    int r = put1(b, (uint8_t)e);
    for (Py_ssize_t i = 0; !r && i < n; i++) {
        if (!kept[i])
            continue;
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!PyUnicode_CheckExact(k))
            return FALLBACK;
        r = put_str(b, k);
        if (!r)
            r = pack(b, PyTuple_GET_ITEM(fields, i), 1, ids);
    }
    return r;
}

static PyObject *journal_payload(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "journal_payload(kind, run_id, fields, e, keys, keep, "
                        "ids) or journal_payload(kind, run_id, map, ids) takes 7 or 4 arguments");
        return NULL;
    }
    int ids = PyObject_IsTrue(args[nargs - 1]);
    if (ids < 0)
        return NULL;
    PyObject *kind = args[0], *run_id = args[1], *fields = args[2];
    PyObject *keys = NULL, *keep = NULL;
    long e = 0;
    if (!PyLong_CheckExact(kind) || !PyUnicode_CheckExact(run_id)) {
        PyErr_SetString(PyExc_TypeError, "journal_payload(int, str, ...)");
        return NULL;
    }
    if (nargs == 4) {       /* a record given as its map: packed as msgpack packs a dict */
        if (!PyDict_CheckExact(fields)) {
            PyErr_SetString(PyExc_TypeError, "journal_payload(kind, run_id, map): a dict");
            return NULL;
        }
    } else {
        keys = args[4];
        keep = args[5];
        if (!PyTuple_Check(fields) || !PyTuple_CheckExact(keys) || !PyTuple_CheckExact(keep)) {
            PyErr_SetString(PyExc_TypeError,
                            "journal_payload(int, str, tuple, int, tuple, tuple)");
            return NULL;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(fields);
        if (PyTuple_GET_SIZE(keys) != n || PyTuple_GET_SIZE(keep) != n) {
            PyErr_SetString(PyExc_ValueError,
                            "journal_payload: fields, keys and keep differ in length");
            return NULL;
        }
        e = PyLong_AsLong(args[3]);
        if (e == -1 && PyErr_Occurred())
            return NULL;
    }
    buf_t b;
    b.p = b.small;
    b.cap = sizeof b.small;
    b.n = 4;                            /* head_len, set below */
    int r = put1(&b, 0x93);             /* [kind, run_id, map] */
    if (!r)
        r = put_int(&b, kind);
    if (!r)
        r = put_str(&b, run_id);
    if (!r)
        r = keys == NULL ? pack(&b, fields, 1, ids) : pack_map(&b, fields, e, keys, keep, ids);
    PyObject *out = NULL;
    if (!r && b.n - 4 > 0xffffffffu)
        r = FALLBACK;
    if (!r) {
        uint32_t hl = (uint32_t)(b.n - 4);
        uint8_t zero[4] = {0, 0, 0, 0};
        for (int i = 0; i < 4; i++)      /* little-endian, FORMAT.md 5 */
            b.p[i] = (char)((hl >> (8 * i)) & 0xff);
        if (put(&b, zero, 4) == 0)
            out = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.n);
    } else if (r == FALLBACK) {
        out = Py_None;
        Py_INCREF(out);
    }
    if (b.p != b.small)
        PyMem_Free(b.p);
    return out;
}

static PyMethodDef methods[] = {
    {"journal_payload", (PyCFunction)(void (*)(void))journal_payload, METH_FASTCALL,
     "journal_payload(kind, run_id, fields, e, keys, keep, ids) or (kind, run_id, map, ids) "
     "-> bytes | None: a journal record's COMMIT payload (None: a value for the Python path; "
     "ids: pack step ids in their compact form, FORMAT.md 5a)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._recpack",
    "A journal record's frame payload packed in one call (csrc/recpack.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recpack(void)
{
    for (long i = 0; i < 3; i++)
        if ((small[i] = PyLong_FromLong(i)) == NULL)    /* kept: the module's for good */
            return NULL;
    return PyModule_Create(&module);
}
