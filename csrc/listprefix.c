/* durkv._listprefix: is one Python list a prefix of another, exactly and fast.
 *
 * The store writes a list channel as a delta when the new list keeps the old one as
 * its prefix (kernel/delta.py). Reducers like operator.add build the new list from the
 * same item objects, so the two item-pointer arrays are byte-identical: one memcmp
 * (~0.1 ns per item) proves it. Where pointers differ, the items are compared with ==
 * (PyObject_RichCompareBool, identity first), exactly as list == list would, so the
 * answer is always the exact one and nothing is allocated.
 *
 * join_tagged() is its read-side twin: it joins a list channel's serialized items
 * into one buffer so that get() deserializes them in one serializer call.
 *
 * decoded_copy() takes the store's own copy of a plain-data list item, in the form the
 * serializer reads it back (plaincopy.h): the state keeps that instead of its bytes.
 *
 * holds_any() finds a pending write of an object a list state already holds (an edit in
 * place the memcmp cannot see).
 *
 * This is a CPython extension, separate from the cffi segment log: it reads list
 * internals (PySequence_Fast_ITEMS), which cffi cannot.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "plaincopy.h"

/* has_prefix(new, old, n) -> bool: len(new) >= n, len(old) >= n, new[:n] == old[:n]. */
static PyObject *has_prefix(PyObject *self, PyObject *args)
{
    PyObject *a, *b;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &a, &PyList_Type, &b, &n))
        return NULL;
    if (n < 0 || PyList_GET_SIZE(a) < n || PyList_GET_SIZE(b) < n)
        Py_RETURN_FALSE;
    PyObject **x = PySequence_Fast_ITEMS(a), **y = PySequence_Fast_ITEMS(b);
    Py_ssize_t i = 0;
    while (i < n) {
        /* skip the identical run in one memcmp, then compare one differing item by value */
        Py_ssize_t run = n - i;
        if (memcmp(x + i, y + i, (size_t)run * sizeof(PyObject *)) == 0)
            break;
        while (x[i] == y[i])
            i++;
        PyObject *u = x[i], *v = y[i];
        Py_INCREF(u);                  /* __eq__ may run Python code that mutates the lists */
        Py_INCREF(v);
        int eq = PyObject_RichCompareBool(u, v, Py_EQ);
        Py_DECREF(u);
        Py_DECREF(v);
        if (eq < 0)
            return NULL;
        if (!eq)
            Py_RETURN_FALSE;
        if (PyList_GET_SIZE(a) < n || PyList_GET_SIZE(b) < n)   /* mutated by __eq__ */
            Py_RETURN_FALSE;
        x = PySequence_Fast_ITEMS(a);
        y = PySequence_Fast_ITEMS(b);
        i++;
    }
    Py_RETURN_TRUE;
}

/* holds_any(items, n, values) -> bool: some object of ``values`` (a list: its items; else
 * the value itself) is one of items[:n] -- the same object, by address. The store asks it
 * of a task's pending writes: a write of an item its newest list state holds may carry an
 * edit made to that object in place, which the prefix compare's memcmp would not see.
 * Immutable scalars are passed over (equal ones are shared; they cannot be edited). */
static int scalar(PyObject *o)
{
    return PyUnicode_CheckExact(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o)
        || PyBytes_CheckExact(o) || PyBool_Check(o) || o == Py_None;
}

static PyObject *holds_any(PyObject *self, PyObject *args)
{
    PyObject *items, *values;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!nO", &PyList_Type, &items, &n, &values))
        return NULL;
    if (n > PyList_GET_SIZE(items))
        n = PyList_GET_SIZE(items);
    PyObject *const *x = PySequence_Fast_ITEMS(items);
    PyObject *one[1] = {values};
    PyObject *const *v = one;
    Py_ssize_t k = 1;
    if (PyList_Check(values)) {
        v = PySequence_Fast_ITEMS(values);
        k = PyList_GET_SIZE(values);
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        if (scalar(v[j]))
            continue;
        for (Py_ssize_t i = 0; i < n; i++)
            if (x[i] == v[j])
                Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* join_tagged(prefix, items, tag) -> bytes | None: prefix + items[0][1:] + items[1][1:] ...
 * when every item is a bytes object whose first byte is tag, else None. One pass, one
 * allocation: a list channel's serialized items become one serializer call (see
 * kernel/langgraph_serde.py), with no per-item Python work. */
static PyObject *join_tagged(PyObject *self, PyObject *args)
{
    PyObject *items;
    const char *prefix;
    Py_ssize_t plen;
    int tag;
    (void)self;
    if (!PyArg_ParseTuple(args, "y#O!i", &prefix, &plen, &PyList_Type, &items, &tag))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items), total = plen;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(items, i);
        if (!PyBytes_Check(b) || PyBytes_GET_SIZE(b) < 1
                || (unsigned char)PyBytes_AS_STRING(b)[0] != (unsigned char)tag)
            Py_RETURN_NONE;
        total += PyBytes_GET_SIZE(b) - 1;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *w = PyBytes_AS_STRING(out);
    memcpy(w, prefix, (size_t)plen);
    w += plen;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(items, i);
        Py_ssize_t len = PyBytes_GET_SIZE(b) - 1;
        memcpy(w, PyBytes_AS_STRING(b) + 1, (size_t)len);
        w += len;
    }
    return out;
}

/* decoded_copy(v) -> copy | None: what the serializer reads back after writing plain
 * data v, made from v itself (plaincopy.h, PLAIN_AS_DECODED); None when v is not plain
 * data whose round trip is the identity. */
static PyObject *decoded_copy(PyObject *self, PyObject *v)
{
    (void)self;
    PyObject *c = plain_copy(v, PLAIN_AS_DECODED);
    if (c != NULL || PyErr_Occurred())
        return c;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"has_prefix", has_prefix, METH_VARARGS,
     "has_prefix(new, old, n) -> bool: both lists have n items and new[:n] == old[:n]."},
    {"holds_any", holds_any, METH_VARARGS,
     "holds_any(items, n, values) -> bool: an object of values (a list's items, or the "
     "value) is one of items[:n], by address; immutable scalars are passed over."},
    {"join_tagged", join_tagged, METH_VARARGS,
     "join_tagged(prefix, items, tag) -> bytes | None: prefix + each item minus its first "
     "byte, if every item is bytes starting with tag."},
    {"decoded_copy", decoded_copy, METH_O,
     "decoded_copy(v) -> copy | None: what the serializer reads back after writing plain "
     "data v, copied from v; None when its round trip would change it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._listprefix",
    "Exact, allocation-free list prefix test for delta encoding.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listprefix(void)
{
    return PyModule_Create(&module);
}
