/* plaincopy.h: copies of plain data, shared by durkv's C extensions (each compiles its
 * own static copy of these functions).
 *
 * Plain data: an exact dict whose keys are exact str, an exact list (and, where tuples
 * are allowed, an exact tuple), and leaves of the immutable exact types str, bytes, int,
 * float, bool and None. plain_copy(v, mode) copies every container, in order, and shares
 * every leaf -- a leaf is immutable, so sharing it shares no state. It returns NULL
 * without an error set when v is not plain data or nests deeper than PLAIN_MAX_DEPTH.
 *
 *   PLAIN_AS_IS       tuples stay tuples (msgfields.c: the copy is packed again).
 *   PLAIN_AS_DECODED  the copy is exactly what LangGraph's JsonPlusSerializer reads back
 *                     after writing v (ormsgpack; OPT_NON_STR_KEYS, OPT_REPLACE_SURROGATES):
 *                     whatever that round trip would change is refused -- a tuple (read
 *                     back as a list), a str holding a surrogate (packed as U+FFFD), an
 *                     int outside msgpack's 64 bits, bytes or a container of 2**32 or
 *                     more (past msgpack's lengths), a str of 2**30 code points or more
 *                     (its UTF-8 may be past them).
 *
 * No Python code runs while a copy is taken (only exact built-in types are walked), so
 * under the GIL the copy is of one moment of v.
 */
#ifndef DURKV_PLAINCOPY_H
#define DURKV_PLAINCOPY_H

#include <Python.h>
#include <stdint.h>

#define PLAIN_MAX_DEPTH 64
enum { PLAIN_AS_IS = 0, PLAIN_AS_DECODED = 1 };

static int plain_leaf_type(PyTypeObject *t)
{
    return t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyLong_Type
        || t == &PyFloat_Type || t == &PyBool_Type || t == Py_TYPE(Py_None);
}

static int plain_has_surrogate(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    if (kind == PyUnicode_1BYTE_KIND)
        return 0;
    if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *p = PyUnicode_2BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++)
            if (p[i] >= 0xd800 && p[i] <= 0xdfff)
                return 1;
        return 0;
    }
    const Py_UCS4 *p = PyUnicode_4BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] >= 0xd800 && p[i] <= 0xdfff)
            return 1;
    return 0;
}

/* 1: leaf v reads back as itself (PLAIN_AS_DECODED's rules); 0: it would not */
static int plain_leaf_round_trips(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type)
        return PyUnicode_GET_LENGTH(v) < ((Py_ssize_t)1 << 30) && !plain_has_surrogate(v);
    if (t == &PyBytes_Type)
        return (uint64_t)PyBytes_GET_SIZE(v) < ((uint64_t)1 << 32);
    if (t == &PyLong_Type) {
        int overflow;
        (void)PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow == 0)
            return 1;
        if (overflow < 0)
            return 0;
        (void)PyLong_AsUnsignedLongLong(v);     /* 2**63 .. 2**64-1: a uint 64 */
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return 1;
    }
    return 1;
}

static PyObject *plain_copy_at(PyObject *v, int mode, int depth);

/* a dict's copy: PyDict_Copy when every value is a leaf, else item by item */
static PyObject *plain_copy_dict(PyObject *v, int mode, int depth)
{
    if (mode == PLAIN_AS_DECODED && (uint64_t)PyDict_GET_SIZE(v) >= ((uint64_t)1 << 32))
        return NULL;
    PyObject *k, *x;
    Py_ssize_t pos = 0;
    int flat = 1;
    while (PyDict_Next(v, &pos, &k, &x)) {
        if (!PyUnicode_CheckExact(k) || (mode == PLAIN_AS_DECODED && plain_has_surrogate(k)))
            return NULL;
        if (!plain_leaf_type(Py_TYPE(x)))
            flat = 0;
        else if (mode == PLAIN_AS_DECODED && !plain_leaf_round_trips(x))
            return NULL;
    }
    if (flat)
        return PyDict_Copy(v);
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    pos = 0;
    while (PyDict_Next(v, &pos, &k, &x)) {
        PyObject *c = plain_copy_at(x, mode, depth + 1);
        if (c == NULL || PyDict_SetItem(out, k, c)) {
            Py_XDECREF(c);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(c);
    }
    return out;
}

static PyObject *plain_copy_at(PyObject *v, int mode, int depth)
{
    PyTypeObject *t = Py_TYPE(v);
    if (plain_leaf_type(t)) {
        if (mode == PLAIN_AS_DECODED && !plain_leaf_round_trips(v))
            return NULL;
        Py_INCREF(v);
        return v;
    }
    if (depth >= PLAIN_MAX_DEPTH)
        return NULL;
    if (t == &PyDict_Type)
        return plain_copy_dict(v, mode, depth);
    if (t == &PyList_Type || (t == &PyTuple_Type && mode == PLAIN_AS_IS)) {
        Py_ssize_t n = Py_SIZE(v);
        if (mode == PLAIN_AS_DECODED && (uint64_t)n >= ((uint64_t)1 << 32))
            return NULL;
        PyObject *out = t == &PyList_Type ? PyList_New(n) : PyTuple_New(n);
        if (out == NULL)
            return NULL;
        PyObject **src = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *c = plain_copy_at(src[i], mode, depth + 1);
            if (c == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            if (t == &PyList_Type)
                PyList_SET_ITEM(out, i, c);
            else
                PyTuple_SET_ITEM(out, i, c);
        }
        return out;
    }
    return NULL;
}

/* A copy of v (new reference); NULL without an error set: not plain data (see above). */
static PyObject *plain_copy(PyObject *v, int mode)
{
    return plain_copy_at(v, mode, 0);
}

#endif
