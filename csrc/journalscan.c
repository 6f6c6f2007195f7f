/* durkv._journalscan: a run's journal records read for a replay, without decoding them all.
 *
 * Store.journal_heads() answers one msgpack array of frame heads [kind, id, record]
 * (docs/FORMAT.md 5a: the record is a map with short keys). A replay needs, of each
 * plain STEP record, only what it compares the call with (fingerprint, kind, name,
 * prompt version) and the result's bytes; msgpack's decode of every record into a dict
 * (~2 us a record: ten keys, two floats, the inputs' and result's bytes) was most of the
 * cost of opening a long run. scan() walks the array once and returns:
 *
 *   steps: one item per head, in log order: for a plain STEP record the tuple
 *          (sid, fp, kind, name, prompt_version, inputs, result, t, offset, length) -- each
 *          field as msgpack would decode it, with the default the fold gives a missing key
 *          (fp 0, kind "step", name "", the others None), and the
 *          record map's bytes at buf[offset:offset + length]; None for any other record;
 *   rest:  the records of the Nones, in order, as one msgpack array (bytes) for one
 *          decode.
 *
 * "Plain" is conservative: e == 2, s a str, k/n str or missing, pv nil/str/missing, err
 * nil or missing, no ir, in and r bin/nil/missing, fp an int/nil/missing, t a number/nil/
 * missing, every key a str. Anything else is a None (decoded and folded as before), so
 * the rule only decides what may stay unfolded, never what a record means
 * (kernel/runtime/journal.py: fold_lazy). A buffer that is not such an array raises
 * ValueError: the caller reads the journal the eager way, which names the bad frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 512

typedef struct {
    const uint8_t *p, *end;
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

/* Skip one object (depth-limited); 0 ok, -1 malformed. */
static int skip(cur_t *c, int depth)
{
    size_t hdr;
    uint64_t len;
    int kind = header(c, &hdr, &len);
    if (!kind || depth > MAX_DEPTH || !need(c, hdr))
        return -1;
    c->p += hdr;
    if (kind == 'a' || kind == 'm') {
        uint64_t n = kind == 'm' ? 2 * len : len;
        for (uint64_t i = 0; i < n; i++)
            if (skip(c, depth + 1))
                return -1;
        return 0;
    }
    if (kind == 'o')
        return 0;
    if ((uint64_t)(c->end - c->p) < len)
        return -1;
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

/* The fields of a record map a replay reads; `plain` cleared by anything unusual. */
typedef struct {
    int plain, e_is_step;
    const uint8_t *s, *k, *n, *pv, *fp, *in, *r, *t;  /* each value's first byte, or NULL */
} fields_t;

static void field(fields_t *f, const char *key, size_t kn, const uint8_t *v)
{
#define KEY(lit) (kn == sizeof(lit) - 1 && memcmp(key, lit, kn) == 0)
    uint8_t b = v[0];
    int nil = b == 0xc0, str = (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
    int intv = b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3);
    if (KEY("e"))
        f->e_is_step = b == 0x02;               /* E_STEP: a positive fixint */
    else if (KEY("s"))
        f->s = str ? v : NULL, f->plain &= str;
    else if (KEY("k"))
        f->k = v, f->plain &= str;
    else if (KEY("n"))
        f->n = v, f->plain &= str;
    else if (KEY("pv"))
        f->pv = v, f->plain &= str || nil;
    else if (KEY("fp"))
        f->fp = v, f->plain &= intv || nil;
    else if (KEY("r"))
        f->r = v, f->plain &= nil || (b >= 0xc4 && b <= 0xc6);
    else if (KEY("in"))
        f->in = v, f->plain &= nil || (b >= 0xc4 && b <= 0xc6);
    else if (KEY("t"))
        f->t = v, f->plain &= nil || intv || b == 0xca || b == 0xcb;
    else if (KEY("err"))
        f->plain &= nil;
    else if (KEY("ir"))
        f->plain = 0;
#undef KEY
}

/* Read the record map at c->p (the cursor moved past it); 0 ok, -1 malformed. */
static int read_record(cur_t *c, fields_t *f)
{
    size_t hdr;
    uint64_t len;
    memset(f, 0, sizeof *f);
    f->plain = 1;
    if (header(c, &hdr, &len) != 'm') {
        f->plain = 0;
        return skip(c, 0);
    }
    c->p += hdr;
    for (uint64_t i = 0; i < len; i++) {
        const char *key = NULL;
        size_t kn = 0;
        if (!str_at(c, &key, &kn)) {
            f->plain = 0;                       /* a key that is not a str */
            if (skip(c, 1))
                return -1;
        }
        const uint8_t *v = c->p;
        if (!need(c, 1) || skip(c, 1))
            return -1;
        if (f->plain)
            field(f, key, kn, v);
    }
    f->plain &= f->e_is_step && f->s != NULL;
    return 0;
}

/* The Python object msgpack decodes the scalar at v to (str, bin, int, float, nil). */
static PyObject *value(const uint8_t *v, const uint8_t *end)
{
    cur_t c = {v, end};
    size_t hdr;
    uint64_t len;
    int kind = header(&c, &hdr, &len);
    uint8_t b = v[0];
    if (kind == 's')
        return PyUnicode_DecodeUTF8((const char *)v + hdr, (Py_ssize_t)len, NULL);
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

static PyObject *step_tuple(const fields_t *f, const uint8_t *end, Py_ssize_t off,
                            Py_ssize_t len, PyObject *defaults[2], PyObject *last[2])
{
    PyObject *t = PyTuple_New(10);
    if (t == NULL)
        return NULL;
    PyObject *items[10] = {
        field_value(f->s, end, Py_None, NULL),
        f->fp == NULL ? PyLong_FromLong(0) : field_value(f->fp, end, Py_None, NULL),
        field_value(f->k, end, defaults[0], &last[0]),
        field_value(f->n, end, defaults[1], &last[1]),
        field_value(f->pv, end, Py_None, NULL),
        field_value(f->in, end, Py_None, NULL),
        field_value(f->r, end, Py_None, NULL),
        field_value(f->t, end, Py_None, NULL),
        PyLong_FromSsize_t(off),
        PyLong_FromSsize_t(len),
    };
    int ok = 1;
    for (int i = 0; i < 10; i++) {
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

static PyObject *bad(Py_ssize_t i, const char *why)
{
    PyErr_Format(PyExc_ValueError, "journal head %zd: %s", i, why);
    return NULL;
}

/* Walk the heads; append each plain STEP record's tuple (or None) to `steps` and the other
 * records' bytes to `rest` (`*nrest` of them). */
static PyObject *walk(cur_t *c, const uint8_t *start, uint64_t n, PyObject *steps,
                      PyObject *rest, uint32_t *nrest)
{
    PyObject *defaults[2] = {PyUnicode_FromString("step"), PyUnicode_FromString("")};
    PyObject *last[2] = {NULL, NULL};
    PyObject *out = NULL;
    if (defaults[0] == NULL || defaults[1] == NULL)
        goto done;
    for (uint64_t i = 0; i < n; i++) {
        size_t hdr;
        uint64_t m;
        if (header(c, &hdr, &m) != 'a' || m < 3) {
            bad((Py_ssize_t)i, "not a list of 3 or more");
            goto done;
        }
        c->p += hdr;
        if (skip(c, 1) || skip(c, 1)) {
            bad((Py_ssize_t)i, "malformed");
            goto done;
        }
        const uint8_t *rec = c->p;
        fields_t f;
        if (read_record(c, &f)) {
            bad((Py_ssize_t)i, "malformed record");
            goto done;
        }
        Py_ssize_t off = rec - start, len = c->p - rec;
        PyObject *item = NULL;
        if (f.plain) {
            item = step_tuple(&f, c->end, off, len, defaults, last);
            if (item == NULL) {             /* e.g. a str that is not UTF-8: folded as before */
                PyErr_Clear();
                f.plain = 0;
            }
        }
        if (!f.plain) {
            item = Py_NewRef(Py_None);
            Py_ssize_t at = PyByteArray_GET_SIZE(rest);
            if (PyByteArray_Resize(rest, at + len) < 0) {
                Py_DECREF(item);
                goto done;
            }
            memcpy(PyByteArray_AS_STRING(rest) + at, rec, (size_t)len);
            (*nrest)++;
        }
        int err = PyList_Append(steps, item);
        Py_DECREF(item);
        if (err)
            goto done;
        for (uint64_t j = 3; j < m; j++)       /* a later version's longer head */
            if (skip(c, 1)) {
                bad((Py_ssize_t)i, "malformed");
                goto done;
            }
    }
    out = Py_None;
done:
    Py_XDECREF(defaults[0]);
    Py_XDECREF(defaults[1]);
    Py_XDECREF(last[0]);
    Py_XDECREF(last[1]);
    return out;
}

/* scan(buf) -> (steps, rest): see the top of this file. */
static PyObject *scan(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *start = view.buf;
    cur_t c = {start, start + view.len};
    PyObject *steps = NULL, *rest = NULL, *result = NULL;
    size_t hdr;
    uint64_t n;
    uint32_t nrest = 0;
    if (header(&c, &hdr, &n) != 'a' || n > (uint64_t)view.len) {
        bad(-1, "the heads are not a msgpack array");
        goto done;
    }
    c.p += hdr;
    steps = PyList_New(0);
    rest = PyByteArray_FromStringAndSize("\xdd\0\0\0\0", 5);   /* array32, count below */
    if (steps == NULL || rest == NULL)
        goto done;
    if (walk(&c, start, n, steps, rest, &nrest) == NULL)
        goto done;
    if (c.p != c.end) {
        bad(-1, "bytes after the heads");
        goto done;
    }
    uint8_t *h = (uint8_t *)PyByteArray_AS_STRING(rest) + 1;
    h[0] = (uint8_t)(nrest >> 24), h[1] = (uint8_t)(nrest >> 16);
    h[2] = (uint8_t)(nrest >> 8), h[3] = (uint8_t)nrest;
    result = PyTuple_Pack(2, steps, rest);
done:
    Py_XDECREF(steps);
    Py_XDECREF(rest);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(heads) -> (steps, rest): a run's journal heads, plain STEP records as tuples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._journalscan",
    "A run's journal records read for a replay (csrc/journalscan.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__journalscan(void) { return PyModule_Create(&module); }
