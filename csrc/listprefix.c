/* durkv._listprefix: is one Python list a prefix of another, exactly and fast.
 *
 * The store writes a list channel as a delta when the new list keeps the old one as
 * its prefix (kernel/delta.py). Reducers like operator.add build the new list from the
 * same item objects, so the two item-pointer arrays are byte-identical: one memcmp
 * (~0.1 ns per item) proves it. Where pointers differ, the items are compared as the
 * serializer would store them: plain data strictly here (exact types, float bits, dict
 * order; never ==, which takes 1 == 1.0 == True), anything else by a callback that
 * compares the serializer's bytes.
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

/* Strict sameness of two values, as a serializer sees them: 1 the same, 0 not, 2 not
 * decidable here (a value of a type other than plain data's: the caller asks the serde).
 * Plain data is compared exactly: the same exact type at every level (True is not 1, 1.0
 * is not 1), a float by its bits (-0.0 is not 0.0), a dict's keys in the same order.
 * == would take 1 == 1.0 == True and {"a": 1} == {"a": True}: the delta would keep the
 * old item and the new one would read back as it. No Python code runs here. */
#define STRICT_MAX_DEPTH 64

static int strict_same(PyObject *u, PyObject *v, int depth)
{
    if (u == v)
        return 1;
    PyTypeObject *t = Py_TYPE(u);
    if (t != Py_TYPE(v))
        return 0;
    if (depth > STRICT_MAX_DEPTH)
        return 0;       /* too deep to prove: a FULL entry is always right */
    if (t == &PyFloat_Type) {
        double a = PyFloat_AS_DOUBLE(u), b = PyFloat_AS_DOUBLE(v);
        return memcmp(&a, &b, sizeof a) == 0;
    }
    if (t == &PyUnicode_Type || t == &PyLong_Type || t == &PyBytes_Type || t == &PyBool_Type) {
        int eq = PyObject_RichCompareBool(u, v, Py_EQ);     /* exact types: no Python code */
        if (eq < 0) {
            PyErr_Clear();
            return 0;
        }
        return eq;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(u);
        if (n != Py_SIZE(v))
            return 0;
        PyObject **a = PySequence_Fast_ITEMS(u), **b = PySequence_Fast_ITEMS(v);
        int undecided = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = strict_same(a[i], b[i], depth + 1);
            if (r == 0)
                return 0;
            undecided |= r == 2;
        }
        return undecided ? 2 : 1;
    }
    if (t == &PyDict_Type) {
        if (PyDict_GET_SIZE(u) != PyDict_GET_SIZE(v))
            return 0;
        Py_ssize_t i = 0, j = 0;
        PyObject *ka, *va, *kb, *vb;
        int undecided = 0;
        while (PyDict_Next(u, &i, &ka, &va)) {
            if (!PyDict_Next(v, &j, &kb, &vb))
                return 0;
            int rk = strict_same(ka, kb, depth + 1);
            if (rk == 0)
                return 0;
            int rv = strict_same(va, vb, depth + 1);
            if (rv == 0)
                return 0;
            undecided |= rk == 2 || rv == 2;
        }
        return undecided ? 2 : 1;
    }
    return 2;
}

/* strict(a, b) -> True | False | None: strict_same for Python (None: not decidable) */
static PyObject *strict(PyObject *self, PyObject *args)
{
    PyObject *a, *b;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &a, &b))
        return NULL;
    int r = strict_same(a, b, 0);
    if (r == 2)
        Py_RETURN_NONE;
    return PyBool_FromLong(r);
}

/* has_prefix(new, old, n, kept=None, same=None) -> bool: len(new) >= n, len(old) >= n,
 * and new[:n] holds the same values as old[:n], each compared as its serializer would
 * store it. ``kept`` (aligned with old) is what the store keeps of each old item
 * (kernel/store/delta.py, _kept_items): None for an exact immutable scalar, a decoded-form
 * copy (an exact dict or list) for plain data, else its bytes or another form. A pair
 * that is not the same object is compared strictly (strict_same) against that copy, or
 * the item; one that plain data cannot decide goes to same(new_item, kept_item, old_item),
 * which compares the serializer's bytes -- without ``same``, such a pair differs. A pair
 * found the same puts the new item in old's place (old is the store's own array): the
 * next compare of the same items is a memcmp. */
static PyObject *has_prefix(PyObject *self, PyObject *args)
{
    PyObject *a, *b, *kept = Py_None, *same = Py_None;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!n|OO", &PyList_Type, &a, &PyList_Type, &b, &n, &kept,
                          &same))
        return NULL;
    if (kept != Py_None && !PyList_Check(kept)) {
        PyErr_SetString(PyExc_TypeError, "has_prefix: kept must be a list or None");
        return NULL;
    }
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
        PyObject *k = kept != Py_None && i < PyList_GET_SIZE(kept) ? PyList_GET_ITEM(kept, i)
                                                                   : NULL;
        int r;
        if (k == Py_None)                   /* an exact immutable scalar, kept as itself */
            r = strict_same(u, v, 0);
        else if (k != NULL && (PyDict_CheckExact(k) || PyList_CheckExact(k)))
            r = strict_same(u, k, 0) == 1;  /* plain data: its copy, as stored */
        else
            r = k == NULL ? strict_same(u, v, 0) : 2;
        Py_INCREF(u);       /* held to the end of the pair: same() and a DECREF below may
                             * run Python code that mutates the lists */
        if (r == 2) {
            if (same == Py_None) {
                Py_DECREF(u);
                Py_RETURN_FALSE;
            }
            Py_INCREF(v);
            Py_XINCREF(k);
            PyObject *res = PyObject_CallFunctionObjArgs(same, u, k ? k : Py_None, v, NULL);
            Py_DECREF(v);
            Py_XDECREF(k);
            r = res == NULL ? -1 : PyObject_IsTrue(res);
            Py_XDECREF(res);
            if (r < 0) {
                Py_DECREF(u);
                return NULL;
            }
        }
        /* the same as stored: old (the store's own array) takes the new item, so the
         * next compare of these items is one memcmp -- a thread read back (get()'s new
         * objects) pays the value compare once, not at every later put */
        if (r && i < PyList_GET_SIZE(a) && i < PyList_GET_SIZE(b) && PyList_GET_ITEM(a, i) == u) {
            PyObject *was = PyList_GET_ITEM(b, i);
            Py_INCREF(u);
            PyList_SET_ITEM(b, i, u);
            Py_DECREF(was);
        }
        Py_DECREF(u);
        if (!r)
            Py_RETURN_FALSE;
        if (PyList_GET_SIZE(a) < n || PyList_GET_SIZE(b) < n)   /* mutated meanwhile */
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
     "has_prefix(new, old, n, kept=None, same=None) -> bool: both lists have n items and "
     "new[:n] holds old[:n]'s values, compared strictly (exact types, float bits, dict "
     "order); what plain data cannot decide goes to same(new_item, kept_item, old_item)."},
    {"strict", strict, METH_VARARGS,
     "strict(a, b) -> True | False | None: the same plain data (exact types at every level, "
     "float bits, dict order); None when a value other than plain data decides it."},
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
    "Exact list prefix test for delta encoding.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listprefix(void)
{
    return PyModule_Create(&module);
}
