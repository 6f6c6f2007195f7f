/* durkv._commitframe: a COMMIT payload (docs/FORMAT.md section 5) laid out in one call.
 *
 * encode_commit(head, entries) -> bytes is the layout
 *
 *     head_len:u32 head n_entries:u32
 *     entry* = kind:u8 flags:u8 reserved:u16=0 depth:u32 prev_lsn:u64 prev_idx:u32
 *              n_items:u32 (item_len:u32 item)*
 *
 * (little-endian), the bytes kernel/payload.py's struct-and-join version built: every
 * checkpoint and pending-write frame goes through it, and in Python it was ~20 small
 * objects (a struct.pack per entry and per item, then a join) on the commit path. Two
 * passes over the entries: one sums the size and checks every field, the second fills
 * one bytes object. It keeps the GIL: the work is a few hundred nanoseconds, and the
 * entries are Python objects (cffi would drop the GIL and copy them into arrays).
 *
 * entries: a list or tuple of 6-sequences (kind, items, flags, depth, prev_lsn, prev_idx)
 * -- plain tuples or payload.CommitEntry -- with items a list or tuple of bytes-like
 * objects. A field out of its range raises OverflowError (struct.error did), a wrong type
 * TypeError: nothing is half-written, the output exists only when all was checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_U32 0xffffffffULL

static void put_u32(unsigned char *w, uint32_t v)
{
    w[0] = (unsigned char)v;
    w[1] = (unsigned char)(v >> 8);
    w[2] = (unsigned char)(v >> 16);
    w[3] = (unsigned char)(v >> 24);
}

static void put_u64(unsigned char *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w + 4, (uint32_t)(v >> 32));
}

/* An unsigned field of at most max; -1 with an exception set otherwise (a bool is an int,
 * as struct.pack takes it). */
static int field(PyObject *o, unsigned long long max, const char *name,
                 unsigned long long *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "entry field %s must be an int, got %.80s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "entry field %s out of range 0..%llu", name, max);
        return -1;
    }
    if (v > max) {
        PyErr_Format(PyExc_OverflowError, "entry field %s out of range 0..%llu", name, max);
        return -1;
    }
    *out = v;
    return 0;
}

/* The bytes of one item: a bytes object's own buffer, else a buffer view (released by
 * the caller through *view when view->obj is set). */
static int item_bytes(PyObject *it, Py_buffer *view, const char **p, Py_ssize_t *n)
{
    view->obj = NULL;
    if (PyBytes_Check(it)) {
        *p = PyBytes_AS_STRING(it);
        *n = PyBytes_GET_SIZE(it);
        return 0;
    }
    if (PyObject_GetBuffer(it, view, PyBUF_SIMPLE) < 0)
        return -1;
    *p = view->buf;
    *n = view->len;
    return 0;
}

/* The size of one item (pass 1): item_bytes without keeping the view. */
static int item_size(PyObject *it, Py_ssize_t *n)
{
    Py_buffer view;
    const char *p;
    if (item_bytes(it, &view, &p, n))
        return -1;
    if (view.obj)
        PyBuffer_Release(&view);
    return 0;
}

typedef struct {
    unsigned long long kind, flags, depth, prev_lsn, prev_idx;
    PyObject *items;      /* a list or tuple (borrowed from the entry) */
} entry_fields;

static int entry_of(PyObject *e, entry_fields *f)
{
    if (!PyTuple_Check(e) && !PyList_Check(e)) {
        PyErr_Format(PyExc_TypeError, "a commit entry must be a 6-tuple, got %.80s",
                     Py_TYPE(e)->tp_name);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(e) != 6) {
        PyErr_Format(PyExc_ValueError, "a commit entry has 6 fields, got %zd",
                     PySequence_Fast_GET_SIZE(e));
        return -1;
    }
    PyObject **x = PySequence_Fast_ITEMS(e);
    f->items = x[1];
    if (!PyList_Check(f->items) && !PyTuple_Check(f->items)) {
        PyErr_Format(PyExc_TypeError, "the items of a commit entry must be a list, got %.80s",
                     Py_TYPE(f->items)->tp_name);
        return -1;
    }
    if (field(x[0], 0xff, "kind", &f->kind) || field(x[2], 0xff, "flags", &f->flags)
            || field(x[3], MAX_U32, "depth", &f->depth)
            || field(x[4], UINT64_MAX, "prev_lsn", &f->prev_lsn)
            || field(x[5], MAX_U32, "prev_idx", &f->prev_idx))
        return -1;
    if ((unsigned long long)PySequence_Fast_GET_SIZE(f->items) > MAX_U32) {
        PyErr_SetString(PyExc_OverflowError, "a commit entry has over 2**32-1 items");
        return -1;
    }
    return 0;
}

/* Pass 1: the payload's size, every field checked. */
static int payload_size(PyObject *entries, Py_ssize_t head_len, Py_ssize_t *total)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(entries);
    PyObject **es = PySequence_Fast_ITEMS(entries);
    size_t size = 8 + (size_t)head_len;
    for (Py_ssize_t i = 0; i < n; i++) {
        entry_fields f;
        if (entry_of(es[i], &f))
            return -1;
        size += 24;
        Py_ssize_t k = PySequence_Fast_GET_SIZE(f.items);
        PyObject **items = PySequence_Fast_ITEMS(f.items);
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t len;
            if (item_size(items[j], &len))
                return -1;
            if ((unsigned long long)len > MAX_U32) {
                PyErr_SetString(PyExc_OverflowError, "a commit item is over 4 GiB");
                return -1;
            }
            size += 4 + (size_t)len;
        }
        if (size > (size_t)PY_SSIZE_T_MAX) {
            PyErr_SetString(PyExc_OverflowError, "commit payload too large");
            return -1;
        }
    }
    *total = (Py_ssize_t)size;
    return 0;
}

/* Pass 2: the bytes (every field was checked by pass 1; an item's buffer may still fail
 * to be taken again, or -- a bytearray changed by another thread -- have another size). */
static int fill(PyObject *entries, unsigned char *w, unsigned char *end)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(entries);
    PyObject **es = PySequence_Fast_ITEMS(entries);
    put_u32(w, (uint32_t)n);
    w += 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        entry_fields f;
        if (entry_of(es[i], &f))
            return -1;
        Py_ssize_t k = PySequence_Fast_GET_SIZE(f.items);
        PyObject **items = PySequence_Fast_ITEMS(f.items);
        w[0] = (unsigned char)f.kind;
        w[1] = (unsigned char)f.flags;
        w[2] = w[3] = 0;
        put_u32(w + 4, (uint32_t)f.depth);
        put_u64(w + 8, f.prev_lsn);
        put_u32(w + 16, (uint32_t)f.prev_idx);
        put_u32(w + 20, (uint32_t)k);
        w += 24;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_buffer view;
            const char *p;
            Py_ssize_t len;
            if (item_bytes(items[j], &view, &p, &len))
                return -1;
            int fits = end - w >= 4 + len;
            if (fits) {
                put_u32(w, (uint32_t)len);
                memcpy(w + 4, p, (size_t)len);
                w += 4 + len;
            }
            if (view.obj)
                PyBuffer_Release(&view);
            if (!fits) {
                PyErr_SetString(PyExc_RuntimeError, "a commit item changed size while encoded");
                return -1;
            }
        }
    }
    if (w != end) {
        PyErr_SetString(PyExc_RuntimeError, "a commit item changed size while encoded");
        return -1;
    }
    return 0;
}

static PyObject *encode_commit(PyObject *self, PyObject *args)
{
    Py_buffer head;
    PyObject *entries;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*O", &head, &entries))
        return NULL;
    PyObject *out = NULL;
    if (!PyList_Check(entries) && !PyTuple_Check(entries)) {
        PyErr_Format(PyExc_TypeError, "entries must be a list or tuple, got %.80s",
                     Py_TYPE(entries)->tp_name);
        goto done;
    }
    if ((unsigned long long)head.len > MAX_U32
            || (unsigned long long)PySequence_Fast_GET_SIZE(entries) > MAX_U32) {
        PyErr_SetString(PyExc_OverflowError, "commit head or entry count over 2**32-1");
        goto done;
    }
    Py_ssize_t total;
    if (payload_size(entries, head.len, &total))
        goto done;
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    put_u32(w, (uint32_t)head.len);
    memcpy(w + 4, head.buf, (size_t)head.len);
    if (fill(entries, w + 4 + head.len, w + total))
        Py_CLEAR(out);
done:
    PyBuffer_Release(&head);
    return out;
}

static PyMethodDef methods[] = {
    {"encode_commit", encode_commit, METH_VARARGS,
     "encode_commit(head, entries) -> bytes: a COMMIT payload (FORMAT.md section 5)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._commitframe",
    "The COMMIT payload layout of the commit path, in one call.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__commitframe(void)
{
    return PyModule_Create(&module);
}
