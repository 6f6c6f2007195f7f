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
 *   witness(c, cls) -> Fields   that copy flattened into one array (see Fields below)
 *       with the message's class: what the history keeps. Fields.fields() builds the
 *       dict again.
 *   same_fields(objs, copies) -> bool   for each Fields copies[i] (objs may be longer),
 *       objs[i] is of its exact class and objs[i].__dict__ is what it holds, as msgpack
 *       would see it: the same exact type at every node,
 *       dicts with the same keys in the same order, floats with the same bits (0.0 is not
 *       -0.0), and no extra fields (__pydantic_extra__ empty).
 *
 * A leaf is taken as unchanged when it is the very object of the copy: it is immutable,
 * so the same object is the same value and type (a str of the history is compared by a
 * pointer, not its length). Containers are always compared item by item: the copy's are
 * durkv's own, never the caller's, so an edit in place of a message's list or dict shows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "plaincopy.h"

/* 1: a is the leaf w (a held leaf of a plain exact type) as msgpack encodes it: the same
 * exact type, and the same object or an equal value (str by code points, bytes by bytes,
 * int by value, float by its bits: 0.0 is not -0.0); 0: not. */
static int same_leaf(PyObject *a, PyObject *w)
{
    PyTypeObject *t = Py_TYPE(w);
    if (Py_TYPE(a) != t)
        return 0;
    if (a == w)
        return 1;
    if (t == &PyUnicode_Type) {             /* code points: msgpack's UTF-8 follows */
        int c = PyUnicode_Compare(a, w);
        if (c == -1 && PyErr_Occurred())
            PyErr_Clear();
        return c == 0;
    }
    if (t == &PyBytes_Type)
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(w)
            && memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(w), (size_t)PyBytes_GET_SIZE(a)) == 0;
    if (t == &PyLong_Type) {
        int overflow_a, overflow_w;
        long long x = PyLong_AsLongLongAndOverflow(a, &overflow_a);
        long long y = PyLong_AsLongLongAndOverflow(w, &overflow_w);
        if (overflow_a || overflow_w)       /* past 64 bits: compared by value, exactly */
            return overflow_a == overflow_w && PyObject_RichCompareBool(a, w, Py_EQ) == 1;
        return x == y;
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(w);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    return 0;                               /* bool, None: singletons, not the same object */
}

/* ---- Fields: durkv's copy of a field dict, flattened ------------------------------------
 *
 * same_fields walks the caller's messages beside durkv's copy on every model call. Kept as
 * dicts, the copy is a second object graph spread over the heap, and the walk reads both
 * (in the graph's loop, mostly cache misses: ~1.1 us a message). A Fields object holds the
 * copy flattened in pre-order in one array: each leaf and each dict key as a reference
 * (all of immutable exact types, held by the Fields object: a caller's leaf that is the
 * very object is the same value, known without reading it), each container as one tagged
 * word, its kind and length. A check reads the caller's objects and that array in order.
 * Fields holds no container, so it takes part in no reference cycle (not GC-tracked). */

enum { K_DICT = 1, K_LIST = 2, K_TUPLE = 3 };
/* a container's word: an odd value (object addresses are aligned), kind and length */
#define TAG(kind, n) ((PyObject *)(((uintptr_t)(n) << 3) | ((uintptr_t)(kind) << 1) | 1u))
#define TAGGED(p) (((uintptr_t)(p)) & 1u)
#define TAG_KIND(p) ((int)((((uintptr_t)(p)) >> 1) & 3u))
#define TAG_LEN(p) ((Py_ssize_t)(((uintptr_t)(p)) >> 3))

typedef struct {
    PyObject_VAR_HEAD
    PyObject *cls;          /* the message's exact class */
    PyObject *slot[1];      /* Py_SIZE(self) words: held leaves and keys, container tags */
} Fields;

static PyTypeObject FieldsType;

/* the words plain data v flattens to, or -1: not plain (or nested deeper than allowed) */
static Py_ssize_t count_words(PyObject *v, int depth)
{
    PyTypeObject *t = Py_TYPE(v);
    if (plain_leaf_type(t))
        return 1;
    if (depth >= PLAIN_MAX_DEPTH)
        return -1;
    Py_ssize_t n = 1;
    if (t == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(v, &pos, &k, &x)) {
            Py_ssize_t c = PyUnicode_CheckExact(k) ? count_words(x, depth + 1) : -1;
            if (c < 0)
                return -1;
            n += 1 + c;
        }
        return n;
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
        PyObject **x = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < Py_SIZE(v); i++) {
            Py_ssize_t c = count_words(x[i], depth + 1);
            if (c < 0)
                return -1;
            n += c;
        }
        return n;
    }
    return -1;
}

/* v's words into s[*at..end) (each leaf and key held); 0, or -1 if v does not fit */
static int flatten(PyObject *v, PyObject **s, Py_ssize_t *at, Py_ssize_t end)
{
    if (*at >= end)
        return -1;
    PyTypeObject *t = Py_TYPE(v);
    if (plain_leaf_type(t)) {
        Py_INCREF(v);
        s[(*at)++] = v;
        return 0;
    }
    if (t == &PyDict_Type) {
        s[(*at)++] = TAG(K_DICT, PyDict_GET_SIZE(v));
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(v, &pos, &k, &x)) {
            if (*at >= end)
                return -1;
            Py_INCREF(k);
            s[(*at)++] = k;
            if (flatten(x, s, at, end))
                return -1;
        }
        return 0;
    }
    s[(*at)++] = TAG(t == &PyList_Type ? K_LIST : K_TUPLE, Py_SIZE(v));
    PyObject **x = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < Py_SIZE(v); i++)
        if (flatten(x[i], s, at, end))
            return -1;
    return 0;
}

/* 1: the caller's value a is what s[*at..end) describes, as msgpack encodes it (the same
 * exact type at every node, dicts with the same keys in the same order, equal leaves);
 * 0: not. Nothing here runs Python code: only exact built-in types are read. */
static int match(PyObject *a, PyObject *const *s, Py_ssize_t *at, Py_ssize_t end)
{
    if (*at >= end)
        return 0;
    PyObject *w = s[(*at)++];
    if (!TAGGED(w))
        return a == w || same_leaf(a, w);
    Py_ssize_t n = TAG_LEN(w);
    int kind = TAG_KIND(w);
    if (kind == K_DICT) {
        if (Py_TYPE(a) != &PyDict_Type || PyDict_GET_SIZE(a) != n)
            return 0;
        Py_ssize_t pos = 0;
        PyObject *k, *x;
        while (PyDict_Next(a, &pos, &k, &x)) {
            if (*at >= end)
                return 0;
            PyObject *wk = s[(*at)++];
            if (TAGGED(wk) || (k != wk && !same_leaf(k, wk)) || !match(x, s, at, end))
                return 0;
        }
        return 1;
    }
    if (Py_TYPE(a) != (kind == K_LIST ? &PyList_Type : &PyTuple_Type) || Py_SIZE(a) != n)
        return 0;
    PyObject **x = PySequence_Fast_ITEMS(a);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!match(x[i], s, at, end))
            return 0;
    return 1;
}

/* the plain data s[*at..end) describes, built anew (new containers, the held leaves) */
static PyObject *unflatten(PyObject *const *s, Py_ssize_t *at, Py_ssize_t end)
{
    if (*at >= end) {
        PyErr_SetString(PyExc_SystemError, "durkv._msgfields: a truncated Fields");
        return NULL;
    }
    PyObject *w = s[(*at)++];
    if (!TAGGED(w)) {
        Py_INCREF(w);
        return w;
    }
    Py_ssize_t n = TAG_LEN(w);
    int kind = TAG_KIND(w);
    if (kind == K_DICT) {
        PyObject *out = PyDict_New();
        for (Py_ssize_t i = 0; out && i < n; i++) {
            PyObject *k = *at < end ? s[(*at)++] : NULL;
            PyObject *x = k && !TAGGED(k) ? unflatten(s, at, end) : NULL;
            if (x == NULL || PyDict_SetItem(out, k, x)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_SystemError, "durkv._msgfields: a malformed Fields");
                Py_XDECREF(x);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(x);
        }
        return out;
    }
    PyObject *out = kind == K_LIST ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *x = unflatten(s, at, end);
        if (x == NULL)
            Py_CLEAR(out);
        else if (kind == K_LIST)
            PyList_SET_ITEM(out, i, x);
        else
            PyTuple_SET_ITEM(out, i, x);
    }
    return out;
}

static void fields_dealloc(Fields *self)
{
    Py_XDECREF(self->cls);
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++)
        if (self->slot[i] && !TAGGED(self->slot[i]))
            Py_DECREF(self->slot[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fields_fields(Fields *self, PyObject *unused)
{
    (void)unused;
    Py_ssize_t at = 0;
    PyObject *out = unflatten(self->slot, &at, Py_SIZE(self));
    if (out && at != Py_SIZE(self)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "durkv._msgfields: a malformed Fields");
        return NULL;
    }
    return out;
}

static PyMethodDef fields_methods[] = {
    {"fields", (PyCFunction)fields_fields, METH_NOARGS,
     "fields() -> dict: the field dict this holds, built anew (the same keys in the same "
     "order, the same leaves): it packs to the bytes the copy it was made of packed to."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._msgfields.Fields",
    .tp_basicsize = sizeof(Fields) - sizeof(PyObject *),
    .tp_itemsize = sizeof(PyObject *),
    .tp_dealloc = (destructor)fields_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "durkv's copy of a message's field dict, flattened for same_fields "
              "(made by witness())",
    .tp_methods = fields_methods,
};

static PyObject *witness(PyObject *self, PyObject *args)
{
    PyObject *c, *cls;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!", &c, &PyType_Type, &cls))
        return NULL;
    Py_ssize_t n = PyDict_CheckExact(c) ? count_words(c, 0) : -1;
    if (n < 0) {
        PyErr_SetString(PyExc_TypeError, "witness() takes a field dict of plain data "
                        "(a copy_fields() result)");
        return NULL;
    }
    Fields *w = PyObject_NewVar(Fields, &FieldsType, n);
    if (w == NULL)
        return NULL;
    memset(w->slot, 0, (size_t)n * sizeof(PyObject *));
    Py_INCREF(cls);
    w->cls = cls;
    Py_ssize_t at = 0;
    /* the copy is durkv's own and nothing ran since it was counted; checked all the same */
    if (flatten(c, w->slot, &at, n) || at != n) {
        Py_DECREF(w);
        PyErr_SetString(PyExc_RuntimeError, "witness(): the field dict changed while read");
        return NULL;
    }
    return (PyObject *)w;
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
    if (PyList_GET_SIZE(objs) < n)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* both lists are read again at every item: an attribute lookup may run Python code */
        if (i >= PyList_GET_SIZE(objs) || i >= PyList_GET_SIZE(copies))
            Py_RETURN_FALSE;
        PyObject *x = PyList_GET_ITEM(objs, i), *c = PyList_GET_ITEM(copies, i);
        if (Py_TYPE(c) != &FieldsType || (PyObject *)Py_TYPE(x) != ((Fields *)c)->cls)
            Py_RETURN_FALSE;
        Py_INCREF(x);
        Py_INCREF(c);
        PyObject *d = plain_fields(x);
        Py_ssize_t at = 0, end = Py_SIZE(c);
        int ok = d && match(d, ((Fields *)c)->slot, &at, end) && at == end;
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
    {"witness", witness, METH_VARARGS,
     "witness(c, cls) -> Fields: a copy_fields() result c, of a message of class cls, "
     "flattened for same_fields."},
    {"same_fields", same_fields, METH_VARARGS,
     "same_fields(objs, copies) -> bool: for each Fields copies[i], objs[i] is of its "
     "class, has no extra fields, and its __dict__ is what it holds, as msgpack encodes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._msgfields",
    "A message history compared by value with durkv's own copy of it.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__msgfields(void)
{
    if (PyType_Ready(&FieldsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FieldsType);
    if (PyModule_AddObject(m, "Fields", (PyObject *)&FieldsType) < 0) {
        Py_DECREF(&FieldsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
