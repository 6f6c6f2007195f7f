/* durkv._commitpath: the store's commit path, the parts that run per value, in C.
 *
 * put_args_ok: check_put's common case (below). encode_writes:
 * encode_writes(writes, dumps, pack, min_bytes, special, f_zstd)
 *     -> (recs, lists, replace) | None
 *
 * is kernel/store/writer.py's Writer.encode_writes for the common case: every write an
 * exact (int, str, value) tuple with an int of 64 bits and a non-empty ASCII channel (what
 * LangGraph passes). It serializes each value with ``dumps`` (the store's serde, called as
 * Python calls it) and stores each serialized item as ``pack`` (the codec's Codec.pack)
 * would: an exact bytes item under ``min_bytes`` that begins with neither zstd's magic nor
 * a jref's (docs/FORMAT.md 5: such items are always compressed) is stored as itself
 * without the call (Codec.pack returns it unchanged); every other item is
 * given to ``pack``. It returns None -- before calling anything -- when some write is not
 * of that shape: the Python path then checks and raises its typed error. An exception of
 * ``dumps`` or ``pack`` propagates as it is; the caller redoes the call on the Python
 * path, which raises the SerializationError naming the channel (tests/test_commitpath.py
 * holds the two paths to the same output over hostile writes).
 *
 * Why in C: the Python loop's interpreter work (a check, a call, a tuple unpack, a list
 * per write) was a visible share of every put_writes (docs/BENCHMARKS.md, "Issue 20:
 * DurkvSaver's put and put_writes in C"). It keeps the GIL: dumps and pack are Python.
 * No reference to a caller's object outlives the call: recs and lists hold the ids, the
 * channel names (str, immutable) and serialized bytes only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char ZSTD_MAGIC[4] = {0x28, (char)0xb5, 0x2f, (char)0xfd};
static const char JREF_MAGIC[4] = {(char)0xc1, 0x6a, 0x72, 0x66};   /* payload.JREF_MAGIC */

/* 1 when every write is an exact (int of 64 bits, non-empty ASCII str, value) tuple. */
static int plain_writes(PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 3)
            return 0;
        PyObject *idx = PyTuple_GET_ITEM(w, 0), *ch = PyTuple_GET_ITEM(w, 1);
        if (!PyLong_CheckExact(idx) || !PyUnicode_CheckExact(ch))
            return 0;
        int over = 0;
        (void)PyLong_AsLongLongAndOverflow(idx, &over);
        if (over)
            return 0;
        if (PyUnicode_READY(ch) < 0) {
            PyErr_Clear();
            return 0;
        }
        if (!PyUnicode_IS_ASCII(ch) || PyUnicode_GET_LENGTH(ch) == 0)
            return 0;
    }
    return 1;
}

/* One serialized item as stored: a new reference, *z set to 1 when compressed. */
static PyObject *stored(PyObject *raw, PyObject *pack, Py_ssize_t min_bytes, int *z)
{
    if (PyBytes_CheckExact(raw)) {
        Py_ssize_t n = PyBytes_GET_SIZE(raw);
        if (n < min_bytes && (n < 4 || (memcmp(PyBytes_AS_STRING(raw), ZSTD_MAGIC, 4) != 0
                                        && memcmp(PyBytes_AS_STRING(raw), JREF_MAGIC, 4) != 0))) {
            *z = 0;
            Py_INCREF(raw);
            return raw;
        }
    }
    PyObject *got = PyObject_CallOneArg(pack, raw);
    if (got == NULL)
        return NULL;
    if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
        PyErr_SetString(PyExc_TypeError, "the codec's pack must return (stored, compressed)");
        Py_DECREF(got);
        return NULL;
    }
    int t = PyObject_IsTrue(PyTuple_GET_ITEM(got, 1));
    if (t < 0) {
        Py_DECREF(got);
        return NULL;
    }
    *z = t;
    PyObject *b = PyTuple_GET_ITEM(got, 0);
    Py_INCREF(b);
    Py_DECREF(got);
    return b;
}

/* A list value: (rec, ch, items, raws, flags) appended to lists; rec's value is set when
 * the frame is built (Writer._place_lists). 0, or -1 with an exception. */
static int list_value(PyObject *idx, PyObject *ch, PyObject *v, PyObject *dumps,
                      PyObject *pack, Py_ssize_t min_bytes, long f_zstd, PyObject *recs,
                      PyObject *lists)
{
    PyObject *raws = PyList_New(0), *items = PyList_New(0), *rec = NULL, *x = NULL;
    int rc = -1;
    if (raws == NULL || items == NULL)
        goto done;
    /* as Python's [dumps(x) for x in v]: the live list, by index (dumps may change it) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
        PyObject *it = PyList_GET_ITEM(v, i);
        Py_INCREF(it);
        PyObject *r = PyObject_CallOneArg(dumps, it);
        Py_DECREF(it);
        if (r == NULL)
            goto done;
        int bad = PyList_Append(raws, r);
        Py_DECREF(r);
        if (bad)
            goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(raws), zc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int z = 0;
        PyObject *b = stored(PyList_GET_ITEM(raws, i), pack, min_bytes, &z);
        if (b == NULL)
            goto done;
        int bad = PyList_Append(items, b);
        Py_DECREF(b);
        if (bad)
            goto done;
        zc += z;
    }
    rec = PyList_New(3);
    if (rec == NULL)
        goto done;
    Py_INCREF(idx);
    PyList_SET_ITEM(rec, 0, idx);
    Py_INCREF(ch);
    PyList_SET_ITEM(rec, 1, ch);
    PyList_SET_ITEM(rec, 2, PyLong_FromLong(0));
    if (PyList_GET_ITEM(rec, 2) == NULL)
        goto done;
    x = Py_BuildValue("(OOOOl)", rec, ch, items, raws, (zc && zc == n) ? f_zstd : 0L);
    if (x == NULL || PyList_Append(lists, x) || PyList_Append(recs, rec))
        goto done;
    rc = 0;
done:
    Py_XDECREF(x);
    Py_XDECREF(rec);
    Py_XDECREF(items);
    Py_XDECREF(raws);
    return rc;
}

static PyObject *encode_writes(PyObject *self, PyObject *args)
{
    PyObject *writes, *dumps, *pack, *special;
    Py_ssize_t min_bytes;
    long f_zstd;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnO!l", &writes, &dumps, &pack, &min_bytes,
                          &PyFrozenSet_Type, &special, &f_zstd))
        return NULL;
    if (!PyList_CheckExact(writes) && !PyTuple_CheckExact(writes))
        Py_RETURN_NONE;
    /* a list of writes is held by a new reference to a copy of its items: a dumps that
     * changes the caller's list changes nothing here (Python iterates it live, but the
     * checked shapes must be the ones encoded) */
    PyObject *seq = PySequence_Fast(writes, "writes");
    if (seq == NULL)
        return NULL;
    PyObject *own = PyList_CheckExact(writes) ? PyList_GetSlice(seq, 0, PY_SSIZE_T_MAX) : seq;
    if (own != seq) {
        Py_DECREF(seq);
        if (own == NULL)
            return NULL;
    }
    if (!plain_writes(own)) {
        Py_DECREF(own);
        Py_RETURN_NONE;
    }
    PyObject *recs = PyList_New(0), *lists = PyList_New(0), *out = NULL;
    int replace = 1;
    if (recs == NULL || lists == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(own);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PySequence_Fast_GET_ITEM(own, i);
        PyObject *idx = PyTuple_GET_ITEM(w, 0), *ch = PyTuple_GET_ITEM(w, 1);
        PyObject *v = PyTuple_GET_ITEM(w, 2);
        if (PyList_CheckExact(v)) {
            if (list_value(idx, ch, v, dumps, pack, min_bytes, f_zstd, recs, lists))
                goto done;
        } else {
            PyObject *r = PyObject_CallOneArg(dumps, v);
            if (r == NULL)
                goto done;
            int z = 0;
            PyObject *b = stored(r, pack, min_bytes, &z);
            Py_DECREF(r);
            if (b == NULL)
                goto done;
            PyObject *rec = PyList_New(3);
            if (rec == NULL) {
                Py_DECREF(b);
                goto done;
            }
            Py_INCREF(idx);
            PyList_SET_ITEM(rec, 0, idx);
            Py_INCREF(ch);
            PyList_SET_ITEM(rec, 1, ch);
            PyList_SET_ITEM(rec, 2, b);
            int bad = PyList_Append(recs, rec);
            Py_DECREF(rec);
            if (bad)
                goto done;
        }
        if (replace) {
            int sp = PySet_Contains(special, ch);
            if (sp < 0)
                goto done;
            replace = sp;
        }
    }
    out = Py_BuildValue("(OOO)", recs, lists, replace ? Py_True : Py_False);
done:
    Py_XDECREF(recs);
    Py_XDECREF(lists);
    Py_DECREF(own);
    return out;
}

/* put_args_ok(thread_id, ns, cid, parent_id, values, versions, all_values) -> bool
 *
 * True when kernel/store/writer.py's check_put would pass without a word: the ids exact
 * strs (thread and checkpoint non-empty), the parent None or an exact str, values and
 * versions exact dicts, every version's channel an exact str and its version an exact
 * str, float or int in -2**63..2**64-1, every channel of values a str, all_values None or
 * a dict, every such str ASCII. False: check_put's Python decides (it raises, or passes a
 * rarer shape: a name or version of other text, checked there for lone surrogates). Only
 * type tests and an int's range: no Python code runs. */
static PyObject *put_args_ok(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "put_args_ok() takes 7 arguments");
        return NULL;
    }
    PyObject *thread_id = a[0], *ns = a[1], *cid = a[2], *parent = a[3], *values = a[4];
    PyObject *versions = a[5], *all_values = a[6];
    if (!PyUnicode_CheckExact(thread_id) || PyUnicode_GET_LENGTH(thread_id) == 0
            || !PyUnicode_CheckExact(ns) || !PyUnicode_CheckExact(cid)
            || PyUnicode_GET_LENGTH(cid) == 0
            || (parent != Py_None && !PyUnicode_CheckExact(parent))
            || !PyDict_CheckExact(values) || !PyDict_CheckExact(versions)
            || (all_values != Py_None && !PyDict_Check(all_values)))
        Py_RETURN_FALSE;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(versions, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_IS_ASCII(k))   /* Python: surrogates */
            Py_RETURN_FALSE;
        if (PyLong_CheckExact(v)) {
            int over = 0;
            (void)PyLong_AsLongLongAndOverflow(v, &over);
            if (over < 0)
                Py_RETURN_FALSE;
            if (over > 0) {
                (void)PyLong_AsUnsignedLongLong(v);
                if (PyErr_Occurred()) {
                    PyErr_Clear();
                    Py_RETURN_FALSE;
                }
            }
        } else if (PyUnicode_CheckExact(v) ? !PyUnicode_IS_ASCII(v) : !PyFloat_CheckExact(v)) {
            Py_RETURN_FALSE;
        }
    }
    pos = 0;
    while (PyDict_Next(values, &pos, &k, &v))
        if (!PyUnicode_Check(k) || !PyUnicode_IS_ASCII(k))
            Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"encode_writes", encode_writes, METH_VARARGS,
     "encode_writes(writes, dumps, pack, min_bytes, special, f_zstd) -> (recs, lists, "
     "replace) or None: Writer.encode_writes for plain (int, str, value) writes."},
    {"put_args_ok", (PyCFunction)(void (*)(void))put_args_ok, METH_FASTCALL,
     "put_args_ok(thread_id, ns, cid, parent_id, values, versions, all_values) -> bool: "
     "check_put would pass (the common shapes, by type tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._commitpath",
    "The store's commit path, the parts that run per value, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__commitpath(void)
{
    return PyModule_Create(&module);
}
