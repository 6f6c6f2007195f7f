/* durkv._msgunpack: a list channel's stored items decoded in one C pass.
 *
 * get() of a list channel hands out every item deserialized afresh (GUARANTEES 10).
 * Through LangGraph an item is msgpack made by its JsonPlusSerializer, read back by
 * ormsgpack.unpackb(ext_hook=..., option=OPT_NON_STR_KEYS). Joining the items under one
 * array header made that one call (listprefix.c's join_tagged) but still copied the
 * whole list into a new buffer (~0.5 MB for 500 messages: page faults) and ran a
 * general decoder. unpack_items() walks the stored items where they are and builds the
 * same objects ormsgpack builds, for the subset of msgpack such items use:
 *
 *   nil, bool, int (any width), float32/64, str (strict UTF-8), bin -> bytes,
 *   array -> list, map with str keys -> dict (a repeated key: the last value wins),
 *   ext -> ext_hook(code, data), the caller's hook (LangGraph's: messages, pydantic
 *   models, Send, ... are built by LangGraph, never here).
 *
 * Anything else -- a non-str map key (ormsgpack makes tuples of array keys), a reserved
 * byte, a short or over-long item, nesting deeper than MAX_DEPTH, invalid UTF-8, a hook
 * that raises an Exception -- makes it return None: the caller then decodes with the
 * serializer itself, so an unusual value reads back exactly as the serializer reads it
 * (and fails as it fails). The only errors raised here are the ones no fallback can
 * cure: MemoryError, and a BaseException that is not an Exception (KeyboardInterrupt)
 * raised by the hook.
 *
 * Every call builds new objects; nothing decoded is kept. unpack_kept() builds a list
 * channel's value from what the store keeps of each item (bytes to decode, or a copy of
 * plain data in the form decoding builds: plaincopy.h, listprefix.c's decoded_copy).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "asciitext.h"
#include "plaincopy.h"

#define MAX_DEPTH 512          /* ormsgpack's own limit is above 1,000: deeper -> fallback */

typedef struct {
    const unsigned char *p, *end;
    PyObject *hook;
    int bail;                  /* 1: outside the subset, or a hook Exception: fall back */
} Reader;

static PyObject *bail(Reader *r)
{
    r->bail = 1;
    return NULL;
}

static int need(Reader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n) {
        r->bail = 1;
        return 0;
    }
    return 1;
}

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* the length that follows a str/bin/array/map/ext marker: n bytes, big-endian */
static int length(Reader *r, int n, size_t *out)
{
    if (!need(r, (size_t)n))
        return 0;
    *out = (size_t)be(r->p, n);
    r->p += n;
    return 1;
}

static PyObject *decode(Reader *r, int depth);

static PyObject *str_of(Reader *r, size_t n)
{
    if (!need(r, n))
        return NULL;
    PyObject *s;
    if (dkv_is_ascii(r->p, n)) {   /* the same str PyUnicode_DecodeUTF8 builds, copied */
        s = dkv_ascii_str(r->p, n);
        if (s == NULL)
            return NULL;
    } else {
        s = PyUnicode_DecodeUTF8((const char *)r->p, (Py_ssize_t)n, NULL);
        if (s == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear();
            return bail(r);
        }
    }
    r->p += n;
    return s;
}

/* Map keys repeat in every item ("role", "content", ...): short ASCII keys come from a
 * small table of str objects with their hash already computed, as ormsgpack's own key
 * cache hands out one str per key. A str is immutable: sharing it shares no state. */
#define KEY_SLOTS 512
#define KEY_MAX 32
static PyObject *key_cache[KEY_SLOTS];

static PyObject *key_of(Reader *r, size_t n)
{
    if (n > KEY_MAX || !need(r, n) || !dkv_is_ascii(r->p, n))
        return str_of(r, n);
    uint32_t h = 2166136261u;              /* FNV-1a of the bytes: the slot */
    for (size_t i = 0; i < n; i++)
        h = (h ^ r->p[i]) * 16777619u;
    PyObject **slot = &key_cache[h % KEY_SLOTS];
    PyObject *k = *slot;
    if (k != NULL && (size_t)PyUnicode_GET_LENGTH(k) == n && memcmp(PyUnicode_DATA(k), r->p, n) == 0) {
        r->p += n;
        Py_INCREF(k);
        return k;
    }
    k = str_of(r, n);
    if (k == NULL || PyObject_Hash(k) == -1) {
        Py_XDECREF(k);
        return NULL;
    }
    Py_INCREF(k);
    Py_XSETREF(*slot, k);
    return k;
}

static PyObject *bin_of(Reader *r, size_t n)
{
    if (!need(r, n))
        return NULL;
    PyObject *b = PyBytes_FromStringAndSize((const char *)r->p, (Py_ssize_t)n);
    if (b != NULL)
        r->p += n;
    return b;
}

static PyObject *array_of(Reader *r, size_t n, int depth)
{
    if ((size_t)(r->end - r->p) < n)       /* every item takes at least one byte */
        return bail(r);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *v = decode(r, depth + 1);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyObject *map_of(Reader *r, size_t n, int depth)
{
    if ((size_t)(r->end - r->p) / 2 < n)   /* a key and a value: two bytes at least */
        return bail(r);
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *k = NULL, *v = NULL;
        if (need(r, 1)) {
            unsigned char m = *r->p;
            size_t kn = 0;
            int ok = 1;
            r->p++;
            if ((m & 0xe0) == 0xa0)
                kn = m & 0x1f;
            else if (m >= 0xd9 && m <= 0xdb)
                ok = length(r, 1 << (m - 0xd9), &kn);
            else
                ok = 0, r->bail = 1;       /* a non-str key: ormsgpack's rules, not ours */
            if (ok)
                k = key_of(r, kn);
        }
        if (k != NULL)
            v = decode(r, depth + 1);
        if (v == NULL || PyDict_SetItem(d, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return d;
}

static PyObject *ext_of(Reader *r, size_t n)
{
    if (!need(r, n + 1))
        return NULL;
    int code = (signed char)r->p[0];
    PyObject *data = PyBytes_FromStringAndSize((const char *)r->p + 1, (Py_ssize_t)n);
    if (data == NULL)
        return NULL;
    r->p += n + 1;
    PyObject *v = PyObject_CallFunction(r->hook, "iO", code, data);
    Py_DECREF(data);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();             /* the serializer's own call raises its own error */
        return bail(r);
    }
    return v;
}

static PyObject *decode(Reader *r, int depth)
{
    if (depth > MAX_DEPTH || !need(r, 1))
        return bail(r);
    unsigned char m = *r->p++;
    size_t n;
    if (m <= 0x7f)
        return PyLong_FromLong(m);
    if (m >= 0xe0)
        return PyLong_FromLong((signed char)m);
    if ((m & 0xe0) == 0xa0)
        return str_of(r, m & 0x1f);
    if ((m & 0xf0) == 0x90)
        return array_of(r, m & 0x0f, depth);
    if ((m & 0xf0) == 0x80)
        return map_of(r, m & 0x0f, depth);
    switch (m) {
    case 0xc0: Py_RETURN_NONE;
    case 0xc2: Py_RETURN_FALSE;
    case 0xc3: Py_RETURN_TRUE;
    case 0xc4: case 0xc5: case 0xc6:
        return length(r, 1 << (m - 0xc4), &n) ? bin_of(r, n) : NULL;
    case 0xc7: case 0xc8: case 0xc9:
        return length(r, 1 << (m - 0xc7), &n) ? ext_of(r, n) : NULL;
    case 0xca: {
        if (!need(r, 4))
            return NULL;
        uint32_t u = (uint32_t)be(r->p, 4);
        float f;
        memcpy(&f, &u, 4);
        r->p += 4;
        return PyFloat_FromDouble((double)f);
    }
    case 0xcb: {
        if (!need(r, 8))
            return NULL;
        uint64_t u = be(r->p, 8);
        double f;
        memcpy(&f, &u, 8);
        r->p += 8;
        return PyFloat_FromDouble(f);
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int w = 1 << (m - 0xcc);
        if (!need(r, (size_t)w))
            return NULL;
        uint64_t u = be(r->p, w);
        r->p += w;
        return PyLong_FromUnsignedLongLong(u);
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = 1 << (m - 0xd0);
        if (!need(r, (size_t)w))
            return NULL;
        uint64_t u = be(r->p, w);
        r->p += w;
        int64_t s = w == 8 ? (int64_t)u : (int64_t)(u ^ (1ULL << (8 * w - 1))) - (int64_t)(1ULL << (8 * w - 1));
        return PyLong_FromLongLong(s);
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        return ext_of(r, (size_t)1 << (m - 0xd4));
    case 0xd9: case 0xda: case 0xdb:
        return length(r, 1 << (m - 0xd9), &n) ? str_of(r, n) : NULL;
    case 0xdc: case 0xdd:
        return length(r, 2 << (m - 0xdc), &n) ? array_of(r, n, depth) : NULL;
    case 0xde: case 0xdf:
        return length(r, 2 << (m - 0xde), &n) ? map_of(r, n, depth) : NULL;
    default:                       /* 0xc1, never used */
        return bail(r);
    }
}

/* 1: b is bytes of at least two bytes, the first of them tag */
static int tagged(PyObject *b, int tag)
{
    return PyBytes_Check(b) && PyBytes_GET_SIZE(b) >= 2
        && (unsigned char)PyBytes_AS_STRING(b)[0] == (unsigned char)tag;
}

/* decode(b[1:]) of a tagged item, all of its bytes one value; NULL: an error, or *bailed */
static PyObject *decode_item(PyObject *b, PyObject *hook, int *bailed)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(b);
    Reader r = {p + 1, p + PyBytes_GET_SIZE(b), hook, 0};
    PyObject *v = decode(&r, 0);
    if (v != NULL && r.p != r.end) {   /* bytes left over: not one value */
        Py_CLEAR(v);
        r.bail = 1;
    }
    *bailed = v == NULL && r.bail;
    return v;
}

/* unpack_items(items, tag, ext_hook) -> list | None: [decode(b[1:]) for b in items] when
 * every item is bytes starting with byte tag and decodes within the subset above, each
 * using all of its bytes; else None (decode with the serializer). */
static PyObject *unpack_items(PyObject *self, PyObject *args)
{
    PyObject *items, *hook;
    int tag;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!iO", &PyList_Type, &items, &tag, &hook))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!tagged(PyList_GET_ITEM(items, i), tag))
            Py_RETURN_NONE;
    /* a hook may run any Python: decode from a copy of the list, which it cannot reach */
    items = PyList_GetSlice(items, 0, n);
    if (items == NULL)
        return NULL;
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        int bailed;
        PyObject *v = decode_item(PyList_GET_ITEM(items, i), hook, &bailed);
        if (v == NULL) {
            Py_CLEAR(out);
            if (!bailed)
                break;                 /* MemoryError or KeyboardInterrupt: raise it */
            Py_DECREF(items);
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(items);
    return out;
}

/* ---- pydantic messages kept as their fields ---------------------------------------------
 *
 * A LangChain message (a pydantic v2 model of a type LangGraph always allows) decodes by
 * validating its fields again (cls(**fields): ~10 us). Once decoded, the store may keep it
 * as (cls, fields, fields_set or None: every field, extra) -- copies of what pydantic
 * holds of that object, plain data only (plaincopy.h), its private attributes None -- and
 * build each later read from them as pydantic's own __copy__ does (cls.__new__, the four
 * slots set directly): the same object decoding the same bytes builds, its containers
 * new. */

static PyObject *s_dict, *s_fields_set, *s_extra, *s_private, *empty_tuple;

static int interned(void)
{
    if (s_dict != NULL)
        return 0;
    s_dict = PyUnicode_InternFromString("__dict__");
    s_fields_set = PyUnicode_InternFromString("__pydantic_fields_set__");
    s_extra = PyUnicode_InternFromString("__pydantic_extra__");
    s_private = PyUnicode_InternFromString("__pydantic_private__");
    empty_tuple = PyTuple_New(0);
    return s_dict && s_fields_set && s_extra && s_private && empty_tuple ? 0 : -1;
}

/* the kept form of model v, or NULL without an error: not one to keep */
static PyObject *model_kept(PyObject *v)
{
    PyObject *d = NULL, *fs = NULL, *ex = NULL, *pv = NULL, *out = NULL;
    PyObject *fields = NULL, *set = NULL, *extra = NULL;
    if (interned())
        return NULL;
    d = PyObject_GetAttr(v, s_dict);
    fs = d == NULL ? NULL : PyObject_GetAttr(v, s_fields_set);
    ex = fs == NULL ? NULL : PyObject_GetAttr(v, s_extra);
    pv = ex == NULL ? NULL : PyObject_GetAttr(v, s_private);
    if (pv == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_Clear();              /* not laid out as pydantic v2 lays a model out */
        goto done;
    }
    if (pv != Py_None || !PyDict_CheckExact(d) || !PySet_CheckExact(fs)
            || !(ex == Py_None || PyDict_CheckExact(ex)))
        goto done;
    fields = plain_copy(d, PLAIN_AS_DECODED);
    if (fields == NULL)
        goto done;
    /* the fields set: None when it is every field in `fields` (a decoded message's: its
     * stored fields are all of them), so the common case keeps no set */
    int every = PySet_GET_SIZE(fs) == PyDict_GET_SIZE(fields);
    if (every) {
        PyObject *it = PyObject_GetIter(fs), *key;
        if (it == NULL)
            goto done;
        while (every && (key = PyIter_Next(it)) != NULL) {
            every = PyDict_Contains(fields, key) == 1;
            Py_DECREF(key);
        }
        Py_DECREF(it);
        if (PyErr_Occurred())
            goto done;
    }
    set = every ? (Py_INCREF(Py_None), Py_None) : PyFrozenSet_New(fs);
    if (set == NULL)
        goto done;
    if (ex == Py_None) {
        extra = Py_None;
        Py_INCREF(extra);
    } else if ((extra = plain_copy(ex, PLAIN_AS_DECODED)) == NULL) {
        goto done;
    }
    out = PyTuple_Pack(4, (PyObject *)Py_TYPE(v), fields, set, extra);
done:
    Py_XDECREF(d);
    Py_XDECREF(fs);
    Py_XDECREF(ex);
    Py_XDECREF(pv);
    Py_XDECREF(fields);
    Py_XDECREF(set);
    Py_XDECREF(extra);
    return out;
}

/* a new model from its kept form (cls, fields, fields_set, extra); NULL: an error */
static PyObject *model_of(PyObject *k)
{
    if (interned())
        return NULL;
    if (PyTuple_GET_SIZE(k) != 4 || !PyType_Check(PyTuple_GET_ITEM(k, 0))) {
        PyErr_SetString(PyExc_TypeError, "a kept model is (cls, fields, fields_set, extra)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(k, 0);
    if (cls->tp_new == NULL) {
        PyErr_SetString(PyExc_TypeError, "a kept model's class cannot be instantiated");
        return NULL;
    }
    PyObject *obj = cls->tp_new(cls, empty_tuple, NULL);
    if (obj == NULL)
        return NULL;
    PyObject *d = plain_copy(PyTuple_GET_ITEM(k, 1), PLAIN_AS_DECODED);
    PyObject *fs = d == NULL ? NULL : PySet_New(PyTuple_GET_ITEM(k, 2) == Py_None
                                                ? d : PyTuple_GET_ITEM(k, 2));
    PyObject *ex = PyTuple_GET_ITEM(k, 3);
    ex = fs == NULL ? NULL
        : ex == Py_None ? (Py_INCREF(ex), ex) : plain_copy(ex, PLAIN_AS_DECODED);
    int rc = -1;
    if (ex != NULL)     /* pydantic's __copy__: the slots set past the model's __setattr__ */
        rc = PyObject_GenericSetAttr(obj, s_dict, d)
            || PyObject_GenericSetAttr(obj, s_fields_set, fs)
            || PyObject_GenericSetAttr(obj, s_extra, ex)
            || PyObject_GenericSetAttr(obj, s_private, Py_None) ? -1 : 0;
    else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a kept model's fields are not plain data");
    Py_XDECREF(d);
    Py_XDECREF(fs);
    Py_XDECREF(ex);
    if (rc) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

static PyObject *py_model_of(PyObject *self, PyObject *k)
{
    (void)self;
    if (!PyTuple_Check(k)) {
        PyErr_SetString(PyExc_TypeError, "model_of(kept): a kept model is a tuple");
        return NULL;
    }
    return model_of(k);
}

static PyObject *py_model_kept(PyObject *self, PyObject *v)
{
    (void)self;
    PyObject *k = model_kept(v);
    if (k != NULL || PyErr_Occurred())
        return k;
    Py_RETURN_NONE;
}

/* unpack_kept(kept, objs, n, tag, ext_hook, models) -> list | None: a list channel's first n
 * items from what the store keeps of each (kernel/store/delta.py, ChanState.raw): None ->
 * objs[i] (an immutable scalar, its own copy), an exact dict or list -> a copy of durkv's
 * own decoded-form copy (containers new, leaves shared), a tuple -> a model built from its
 * kept form, bytes -> decoded as unpack_items decodes it; a decoded object whose type is
 * in the set `models` is then kept in `kept` by its fields (in place of its bytes, if
 * they are still there), so the next read builds it instead of validating it again. None
 * when an item must be decoded by the serializer. */
static PyObject *unpack_kept(PyObject *self, PyObject *args)
{
    PyObject *kept, *objs, *hook, *models, *orig;
    Py_ssize_t n;
    int tag;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!niOO", &PyList_Type, &kept, &PyList_Type, &objs, &n, &tag,
                          &hook, &models))
        return NULL;
    if (n < 0 || PyList_GET_SIZE(kept) < n || PyList_GET_SIZE(objs) < n) {
        PyErr_SetString(PyExc_ValueError, "unpack_kept: fewer kept items or objects than n");
        return NULL;
    }
    if (models != Py_None && !PyAnySet_Check(models)) {
        PyErr_SetString(PyExc_TypeError, "unpack_kept: models is a set of types or None");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(kept, i);
        if (k != Py_None && !PyDict_CheckExact(k) && !PyList_CheckExact(k)
                && !PyTuple_CheckExact(k) && !tagged(k, tag))
            Py_RETURN_NONE;
    }
    /* a hook may run any Python: work from copies of both lists, which it cannot reach */
    orig = kept;
    kept = PyList_GetSlice(orig, 0, n);
    objs = kept == NULL ? NULL : PyList_GetSlice(objs, 0, n);
    if (objs == NULL) {
        Py_XDECREF(kept);
        return NULL;
    }
    PyObject *out = PyList_New(n);
    int bailed = 0;
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *k = PyList_GET_ITEM(kept, i), *v;
        if (k == Py_None) {
            v = PyList_GET_ITEM(objs, i);
            Py_INCREF(v);
        } else if (PyDict_CheckExact(k) || PyList_CheckExact(k)) {
            v = plain_copy(k, PLAIN_AS_DECODED);
            bailed = v == NULL && !PyErr_Occurred();
        } else if (PyTuple_CheckExact(k)) {
            v = model_of(k);
        } else {
            v = decode_item(k, hook, &bailed);
            int known = v == NULL || models == Py_None ? 0
                : PySet_Contains(models, (PyObject *)Py_TYPE(v));
            if (known < 0) {
                Py_CLEAR(v);
            } else if (known) {
                PyObject *form = model_kept(v);     /* before v is handed out */
                if (form == NULL && PyErr_Occurred()) {
                    Py_CLEAR(v);
                } else if (form != NULL) {
                    if (i < PyList_GET_SIZE(orig) && PyList_GET_ITEM(orig, i) == k)
                        PyList_SetItem(orig, i, form);  /* steals form; `kept` holds k */
                    else
                        Py_DECREF(form);    /* the store's list changed meanwhile */
                }
            }
        }
        if (v == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(kept);
    Py_DECREF(objs);
    if (out == NULL && bailed)
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"unpack_items", unpack_items, METH_VARARGS,
     "unpack_items(items, tag, ext_hook) -> list | None: each tagged msgpack item decoded "
     "as ormsgpack decodes it, or None where the serializer must decode them."},
    {"unpack_kept", unpack_kept, METH_VARARGS,
     "unpack_kept(kept, objs, n, tag, ext_hook, models) -> list | None: a list channel's "
     "first n items from what the store keeps of each, or None where the serializer must "
     "decode; a decoded model of a type in models is kept by its fields from then on."},
    {"model_kept", py_model_kept, METH_O,
     "model_kept(model) -> tuple | None: the kept form (cls, fields, fields_set, extra) of a "
     "pydantic v2 model of plain data, or None."},
    {"model_of", py_model_of, METH_O,
     "model_of(kept) -> model: a new model built from its kept form."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._msgunpack",
    "A list channel's msgpack items decoded in one C pass (read side of get()).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__msgunpack(void)
{
    return PyModule_Create(&module);
}
