/* durkv._commitpath: the loops of the LangGraph commit path that run per value, in C.
 *
 * encode_writes(writes, dumps, pack, min_bytes, special, f_zstd)
 *     -> (recs, lists, replace) | None
 *
 * is kernel/store/writer.py's Writer.encode_writes for the common case: every write an
 * exact (int, str, value) tuple with an int of 64 bits and a non-empty ASCII channel (what
 * LangGraph passes). It serializes each value with ``dumps`` (the store's serde, called as
 * Python calls it) and stores each serialized item as ``pack`` (the codec's Codec.pack)
 * would: an exact bytes item under ``min_bytes`` that does not begin with zstd's magic is
 * stored as itself without the call (Codec.pack returns it unchanged); every other item is
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
#include <stddef.h>
#include <string.h>

static const char ZSTD_MAGIC[4] = {0x28, (char)0xb5, 0x2f, (char)0xfd};

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
        if (n < min_bytes && (n < 4 || memcmp(PyBytes_AS_STRING(raw), ZSTD_MAGIC, 4) != 0)) {
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

/* Dumps(serde, empty, empty_bytes, tag, pack, asked): LangGraphSerde.dumps as one C call.
 *
 * kernel/langgraph_serde.py's LangGraphSerde._dumps_py is the definition: EMPTY is its one
 * byte; None is the serde's ``_none`` when set (the plain serializer's bytes for it,
 * asked once); under a plain JsonPlusSerializer (the serde's ``_plain``, read at every call: the
 * serializer may be swapped in place) a value that is not None, bytes or a bytearray is
 * the msgpack tag byte and ``pack`` (langgraph_messages.pack_msgpack, ormsgpack in C)
 * of it, unless ``pack`` raises an Exception; everything else is ``asked(serde, obj)``
 * (the serializer's own dumps_typed). The commit path serializes ~8 values a superstep
 * through this: the Python method's frame was most of a small value's cost. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *serde, *empty, *empty_bytes, *pack, *asked;
    PyObject *tag_bytes;
    char tag;
} Dumps;

static PyObject *plain_attr, *none_attr;    /* "_plain", "_none", interned */

static PyObject *dumps_one(Dumps *d, PyObject *obj)
{
    if (obj == d->empty) {
        Py_INCREF(d->empty_bytes);
        return d->empty_bytes;
    }
    if (obj == Py_None) {
        /* the serializer's bytes for None, asked once (the serde's _none), if plain */
        PyObject *nb = PyObject_GetAttr(d->serde, none_attr);
        if (nb == NULL)
            return NULL;
        if (nb != Py_None)
            return nb;
        Py_DECREF(nb);
    }
    if (d->pack != Py_None && obj != Py_None && !PyBytes_Check(obj) && !PyByteArray_Check(obj)) {
        PyObject *plain = PyObject_GetAttr(d->serde, plain_attr);
        if (plain == NULL)
            return NULL;
        int on = PyObject_IsTrue(plain);
        Py_DECREF(plain);
        if (on < 0)
            return NULL;
        if (on) {
            PyObject *r = PyObject_CallOneArg(d->pack, obj);
            if (r != NULL && PyBytes_Check(r)) {
                Py_ssize_t n = PyBytes_GET_SIZE(r);
                PyObject *out = PyBytes_FromStringAndSize(NULL, n + 1);
                if (out != NULL) {
                    PyBytes_AS_STRING(out)[0] = d->tag;
                    memcpy(PyBytes_AS_STRING(out) + 1, PyBytes_AS_STRING(r), (size_t)n);
                }
                Py_DECREF(r);
                return out;
            }
            if (r != NULL) {
                /* not bytes (never from ormsgpack): Python's concatenation decides */
                PyObject *out = PySequence_Concat(d->tag_bytes, r);
                Py_DECREF(r);
                if (out != NULL)
                    return out;
            }
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL;        /* a BaseException passes, as through `except Exception` */
            } else {
                PyErr_Clear();      /* ormsgpack refused: the serializer decides */
            }
        }
    }
    return PyObject_CallFunctionObjArgs(d->asked, d->serde, obj, NULL);
}

static PyObject *dumps_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "dumps(obj) takes exactly one argument");
        return NULL;
    }
    return dumps_one((Dumps *)self, args[0]);
}

static PyObject *dumps_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *serde, *empty, *empty_bytes, *tag, *pack, *asked;
    (void)kw;
    if (!PyArg_ParseTuple(args, "OOO!O!OO", &serde, &empty, &PyBytes_Type, &empty_bytes,
                          &PyBytes_Type, &tag, &pack, &asked))
        return NULL;
    if (PyBytes_GET_SIZE(tag) != 1) {
        PyErr_SetString(PyExc_ValueError, "the tag is one byte");
        return NULL;
    }
    Dumps *d = (Dumps *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    d->vectorcall = dumps_vectorcall;
    Py_INCREF(serde); d->serde = serde;
    Py_INCREF(empty); d->empty = empty;
    Py_INCREF(empty_bytes); d->empty_bytes = empty_bytes;
    Py_INCREF(pack); d->pack = pack;
    Py_INCREF(asked); d->asked = asked;
    Py_INCREF(tag); d->tag_bytes = tag;
    d->tag = PyBytes_AS_STRING(tag)[0];
    return (PyObject *)d;
}

static int dumps_traverse(Dumps *d, visitproc visit, void *arg)
{
    Py_VISIT(d->serde);
    Py_VISIT(d->empty);
    Py_VISIT(d->pack);
    Py_VISIT(d->asked);
    return 0;
}

static int dumps_clear(Dumps *d)
{
    Py_CLEAR(d->serde);
    Py_CLEAR(d->empty);
    Py_CLEAR(d->empty_bytes);
    Py_CLEAR(d->tag_bytes);
    Py_CLEAR(d->pack);
    Py_CLEAR(d->asked);
    return 0;
}

static void dumps_dealloc(Dumps *d)
{
    PyObject_GC_UnTrack(d);
    dumps_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyTypeObject DumpsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._commitpath.Dumps",
    .tp_basicsize = sizeof(Dumps),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Dumps(serde, empty, empty_bytes, tag, pack, asked): LangGraphSerde.dumps "
              "in C (kernel/langgraph_serde.py).",
    .tp_new = dumps_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Dumps, vectorcall),
    .tp_traverse = (traverseproc)dumps_traverse,
    .tp_clear = (inquiry)dumps_clear,
    .tp_dealloc = (destructor)dumps_dealloc,
};

/* checkpoint_metadata(config, metadata, excluded, chainmap) -> dict | None
 *
 * kernel/langgraph.py's checkpoint_metadata (LangGraph's get_checkpoint_metadata) for what
 * its loop passes: config an exact dict, metadata an exact dict, the config's "metadata"
 * and "configurable" each an exact dict or a ChainMap of one exact dict, every key an
 * exact str and every str value an exact str. No Python code runs while a dict is walked
 * (exact str keys hash and compare in C; str.replace of an exact str cannot be
 * overridden). Anything else -- a key or value of another type that the rule would
 * touch, a Mapping of another kind -- returns None before anything is built: the Python
 * function decides (tests/test_langgraph_metadata.py holds the two to LangGraph's). */
static PyObject *nul_str, *empty_str, *maps_attr;

/* v with NULs taken out (an exact str), new reference */
static PyObject *no_nul(PyObject *v)
{
    if (PyUnicode_FindChar(v, 0, 0, PyUnicode_GET_LENGTH(v), 1) == -1) {
        Py_INCREF(v);
        return v;
    }
    return PyUnicode_Replace(v, nul_str, empty_str, -1);
}

/* the one exact dict behind a config's metadata/configurable, or NULL (borrowed) */
static PyObject *scalars_of(PyObject *obj, PyObject *chainmap)
{
    if (PyDict_CheckExact(obj))
        return obj;
    if ((PyObject *)Py_TYPE(obj) != chainmap)
        return NULL;
    PyObject *maps = PyObject_GetAttr(obj, maps_attr);
    if (maps == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *got = NULL;
    if (PyList_CheckExact(maps) && PyList_GET_SIZE(maps) == 1
            && PyDict_CheckExact(PyList_GET_ITEM(maps, 0)))
        got = PyList_GET_ITEM(maps, 0);
    Py_DECREF(maps);        /* the ChainMap holds the list, the list the dict */
    return got;
}

static PyObject *checkpoint_metadata(PyObject *self, PyObject *args)
{
    PyObject *config, *metadata, *excluded, *chainmap;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO", &config, &metadata, &excluded, &chainmap))
        return NULL;
    if (!PyDict_CheckExact(config) || !PyDict_CheckExact(metadata)
            || !PyAnySet_CheckExact(excluded))
        Py_RETURN_NONE;
    PyObject *srcs[2] = {NULL, NULL};
    static const char *names[2] = {"metadata", "configurable"};
    for (int i = 0; i < 2; i++) {
        PyObject *obj = PyDict_GetItemString(config, names[i]);     /* borrowed */
        if (obj == NULL || obj == Py_None)
            continue;
        if (PyDict_CheckExact(obj) && PyDict_GET_SIZE(obj) == 0)
            continue;
        srcs[i] = scalars_of(obj, chainmap);
        if (srcs[i] == NULL)
            Py_RETURN_NONE;
    }
    /* every key a str, every str value an exact str: checked before anything is built */
    PyObject *dicts[3] = {metadata, srcs[0], srcs[1]};
    for (int i = 0; i < 3; i++) {
        if (dicts[i] == NULL)
            continue;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(dicts[i], &pos, &k, &v))
            if (!PyUnicode_CheckExact(k) || (PyUnicode_Check(v) && !PyUnicode_CheckExact(v)))
                Py_RETURN_NONE;
    }
    PyObject *md = PyDict_New();
    if (md == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(metadata, &pos, &k, &v)) {
        PyObject *x = PyUnicode_CheckExact(v) ? no_nul(v) : (Py_INCREF(v), v);
        if (x == NULL || PyDict_SetItem(md, k, x)) {
            Py_XDECREF(x);
            goto fail;
        }
        Py_DECREF(x);
    }
    for (int i = 1; i < 3; i++) {
        if (dicts[i] == NULL)
            continue;
        pos = 0;
        while (PyDict_Next(dicts[i], &pos, &k, &v)) {
            int has = PyDict_Contains(md, k);
            if (has < 0)
                goto fail;
            if (has)
                continue;
            has = PySet_Contains(excluded, k);
            if (has < 0)
                goto fail;
            if (has)
                continue;
            if (PyUnicode_GET_LENGTH(k) >= 2 && PyUnicode_READ_CHAR(k, 0) == '_'
                    && PyUnicode_READ_CHAR(k, 1) == '_')
                continue;
            PyObject *x;
            if (PyUnicode_CheckExact(v))
                x = no_nul(v);
            else if (PyLong_Check(v) || PyFloat_Check(v))
                x = (Py_INCREF(v), v);
            else
                continue;
            if (x == NULL || PyDict_SetItem(md, k, x)) {
                Py_XDECREF(x);
                goto fail;
            }
            Py_DECREF(x);
        }
    }
    return md;
fail:
    Py_DECREF(md);
    return NULL;
}

/* put_args_ok(thread_id, ns, cid, parent_id, values, versions, all_values) -> bool
 *
 * True when kernel/store/writer.py's check_put would pass without a word: the ids exact
 * strs (thread and checkpoint non-empty), the parent None or an exact str, values and
 * versions exact dicts, every version's channel an exact str and its version an exact
 * str, float or int in -2**63..2**64-1, every channel of values a str, all_values None or
 * a dict. False: check_put's Python decides (it raises, or passes a rarer shape). Only
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
        if (!PyUnicode_CheckExact(k))
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
        } else if (!PyUnicode_CheckExact(v) && !PyFloat_CheckExact(v)) {
            Py_RETURN_FALSE;
        }
    }
    pos = 0;
    while (PyDict_Next(values, &pos, &k, &v))
        if (!PyUnicode_Check(k))
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
    {"checkpoint_metadata", checkpoint_metadata, METH_VARARGS,
     "checkpoint_metadata(config, metadata, excluded, chainmap) -> dict or None: "
     "durkv.langgraph.checkpoint_metadata for plain dicts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._commitpath",
    "The per-value loops of the LangGraph commit path, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__commitpath(void)
{
    plain_attr = PyUnicode_InternFromString("_plain");
    none_attr = PyUnicode_InternFromString("_none");
    maps_attr = PyUnicode_InternFromString("maps");
    nul_str = PyUnicode_FromOrdinal(0);
    empty_str = PyUnicode_FromString("");
    if (plain_attr == NULL || none_attr == NULL || maps_attr == NULL || nul_str == NULL || empty_str == NULL || PyType_Ready(&DumpsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&DumpsType);
    if (PyModule_AddObject(m, "Dumps", (PyObject *)&DumpsType) < 0) {
        Py_DECREF(&DumpsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
