/* durkv._msgfields: is an agent's message history what durkv last encoded, by value.
 *
 * A durable model step encodes its whole message list on every call, to fingerprint it
 * and to refer to the items an earlier record holds (docs/GUARANTEES.md 16.8, 16.10);
 * kernel/langgraph_messages.py proves the leading messages unchanged by packing their
 * field dicts again and comparing bytes (O(history) of msgpack a call). This module
 * proves the same against durkv's own copy of those field dicts, taken when they were
 * encoded, without packing anything:
 *
 *   copy_fields(d) -> dict | None   a copy of a message's field dict: every dict, list
 *       and tuple inside copied (in order), every leaf of an immutable exact type (str,
 *       bytes, int, float, bool, None) shared; None when anything else is inside (a
 *       subclass, a set, a model...), or it nests deeper than 64. The caller packs the
 *       copy, so its bytes are those of the copy whatever another thread does to the
 *       message meanwhile.
 *   same_fields(objs, copies) -> bool   objs[i].__dict__ equals copies[i] for every i,
 *       as msgpack would see it: the same exact type at every node, dicts with the same
 *       keys in the same order, floats with the same bits (0.0 is not -0.0), and no
 *       extra fields (__pydantic_extra__ empty).
 *
 * A leaf is taken as unchanged when it is the very object of the copy: it is immutable,
 * so the same object is the same value and type (a str of the history is compared by a
 * pointer, not its length). Containers are always compared item by item: the copy's are
 * durkv's own, never the caller's, so an edit in place of a message's list or dict shows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#include "plaincopy.h"

/* 1: a and b are the same plain value, as msgpack encodes it; 0: not (or not plain). */
static int same(PyObject *a, PyObject *b, int depth)
{
    PyTypeObject *t = Py_TYPE(a);
    if (t != Py_TYPE(b))
        return 0;
    if (a == b && plain_leaf_type(t))
        return 1;
    if (t == &PyUnicode_Type) {             /* code points: msgpack's UTF-8 follows */
        int c = PyUnicode_Compare(a, b);
        if (c == -1 && PyErr_Occurred())
            PyErr_Clear();
        return c == 0;
    }
    if (t == &PyBytes_Type)
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b)
            && memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(a)) == 0;
    if (t == &PyLong_Type) {
        int overflow_a, overflow_b;
        long long x = PyLong_AsLongLongAndOverflow(a, &overflow_a);
        long long y = PyLong_AsLongLongAndOverflow(b, &overflow_b);
        if (overflow_a || overflow_b)       /* past 64 bits: compared by value, exactly */
            return overflow_a == overflow_b && PyObject_RichCompareBool(a, b, Py_EQ) == 1;
        return x == y;
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (t == &PyBool_Type || t == Py_TYPE(Py_None))
        return 0;                           /* singletons: not the same object */
    if (depth >= PLAIN_MAX_DEPTH)
        return 0;
    if (t == &PyDict_Type) {
        if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
            return 0;
        Py_ssize_t i = 0, j = 0;
        PyObject *ka, *va, *kb, *vb;
        while (PyDict_Next(a, &i, &ka, &va)) {
            if (!PyDict_Next(b, &j, &kb, &vb) || !PyUnicode_CheckExact(ka)
                    || !same(ka, kb, depth + 1) || !same(va, vb, depth + 1))
                return 0;
        }
        return 1;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(a);
        if (n != Py_SIZE(b))
            return 0;
        PyObject **x = PySequence_Fast_ITEMS(a), **y = PySequence_Fast_ITEMS(b);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!same(x[i], y[i], depth + 1))
                return 0;
        return 1;
    }
    return 0;
}

static PyObject *copy_fields(PyObject *self, PyObject *d)
{
    (void)self;
    if (!PyDict_CheckExact(d))
        Py_RETURN_NONE;
    PyObject *c = plain_copy(d, PLAIN_AS_IS);
    if (c)
        return c;
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* Where a class keeps what same_fields reads, found once per class: its
 * `__pydantic_extra__` slot (a member descriptor's offset), when its instance dict is the
 * standard `__dict__` and it has no __getattribute__ of its own (pydantic's __getattr__
 * runs only when a lookup fails: not for these two). Any other class gets 0: read through
 * the attribute protocol. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t extra;       /* > 0: the slot's offset */
} layout;

static layout layouts[16];

static Py_ssize_t extra_slot(PyTypeObject *t)
{
    static PyObject *s_extra, *s_dict, *s_getattribute;
    for (int i = 0; i < 16 && layouts[i].type; i++)
        if (layouts[i].type == t)
            return layouts[i].extra;
    if ((!s_extra && !(s_extra = PyUnicode_InternFromString("__pydantic_extra__")))
            || (!s_dict && !(s_dict = PyUnicode_InternFromString("__dict__")))
            || (!s_getattribute
                && !(s_getattribute = PyUnicode_InternFromString("__getattribute__"))))
        return PyErr_Clear(), 0;
    Py_ssize_t off = 0;
    PyObject *d = _PyType_Lookup(t, s_extra);       /* borrowed, all three */
    PyObject *dict = _PyType_Lookup(t, s_dict);
    PyObject *ga = _PyType_Lookup(t, s_getattribute);
    if (d && Py_TYPE(d) == &PyMemberDescr_Type && dict && Py_TYPE(dict) == &PyGetSetDescr_Type
            && ga && ga == _PyType_Lookup(&PyBaseObject_Type, s_getattribute)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX || m->type == T_OBJECT)
            off = m->offset;
    }
    for (int i = 0; i < 16; i++)
        if (!layouts[i].type) {     /* classes are immortal enough: a message class */
            Py_INCREF(t);
            layouts[i] = (layout){t, off};
            break;
        }
    return off;
}

/* x's field dict (borrowed) when x has no extra fields, else NULL (no error set). */
static PyObject *plain_fields(PyObject *x)
{
    static PyObject *s_dict, *s_extra;
    PyTypeObject *t = Py_TYPE(x);
    Py_ssize_t off = extra_slot(t);
    if (off > 0) {                  /* the common case: two loads, no lookup */
        PyObject *extra = *(PyObject **)((char *)x + off);
        if (!extra || (extra != Py_None && !(PyDict_CheckExact(extra) && !PyDict_GET_SIZE(extra))))
            return NULL;
        PyObject **dp = _PyObject_GetDictPtr(x);
        return dp && *dp && PyDict_CheckExact(*dp) ? *dp : NULL;
    }
    if ((!s_dict && !(s_dict = PyUnicode_InternFromString("__dict__")))
            || (!s_extra && !(s_extra = PyUnicode_InternFromString("__pydantic_extra__"))))
        return PyErr_Clear(), NULL;
    PyObject *extra = PyObject_GetAttr(x, s_extra);
    PyObject *d = extra ? PyObject_GetAttr(x, s_dict) : NULL;
    int ok = d && PyDict_CheckExact(d)
        && (extra == Py_None || (PyDict_CheckExact(extra) && !PyDict_GET_SIZE(extra)));
    Py_XDECREF(extra);
    Py_XDECREF(d);                  /* x holds it: borrowed while x lives */
    if (PyErr_Occurred())           /* no such attribute: not a message this path knows */
        PyErr_Clear();
    return ok ? d : NULL;
}

static PyObject *same_fields(PyObject *self, PyObject *args)
{
    PyObject *objs, *copies;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &objs, &PyList_Type, &copies))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(copies);
    if (PyList_GET_SIZE(objs) != n)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* both lists are read again at every item: an attribute lookup may run Python code */
        if (i >= PyList_GET_SIZE(objs) || i >= PyList_GET_SIZE(copies))
            Py_RETURN_FALSE;
        PyObject *x = PyList_GET_ITEM(objs, i), *c = PyList_GET_ITEM(copies, i);
        Py_INCREF(x);
        Py_INCREF(c);
        PyObject *d = plain_fields(x);
        int ok = d && PyDict_CheckExact(c) && same(d, c, 0);
        Py_DECREF(x);
        Py_DECREF(c);
        if (!ok)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"copy_fields", copy_fields, METH_O,
     "copy_fields(d) -> dict | None: durkv's own copy of a message's plain field dict."},
    {"same_fields", same_fields, METH_VARARGS,
     "same_fields(objs, copies) -> bool: each objs[i].__dict__ is copies[i], as msgpack "
     "encodes it, and has no extra fields."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._msgfields",
    "A message history compared by value with durkv's own copy of it.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__msgfields(void)
{
    return PyModule_Create(&module);
}
