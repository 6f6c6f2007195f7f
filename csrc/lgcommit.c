/* durkv._lgcommit: DurkvSaver's commit path, the LangGraph side, in C.
 *
 * Dumps: LangGraphSerde.dumps in one call; checkpoint_metadata: the metadata merge of a
 * put; put_args, put_writes_args: DurkvSaver.put's and put_writes' arguments taken apart. Each is held by a test to the Python function that defines it
 * (tests/test_commitpath.py); both keep the GIL, and neither keeps a reference to a
 * caller's object beyond the call (the merged dict holds the caller's values, as the
 * Python merge's does). Why in C: docs/BENCHMARKS.md, "Issue 20: DurkvSaver's put and
 * put_writes in C".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

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
    .tp_name = "durkv._lgcommit.Dumps",
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

/* put_args(config, checkpoint, metadata, new_versions, empty)
 *     -> (conf, thread_id, ns, cid, all_values, record, versions, parent_id, values) | None
 *
 * kernel/langgraph.py's put_args_py for what LangGraph's loop passes: config and its
 * "configurable" exact dicts, a non-empty exact str thread id, the namespace missing, None
 * or an exact str, the checkpoint an exact dict with an exact str "id" and exact dicts
 * "channel_values" and "channel_versions", metadata and new_versions exact dicts, and
 * every channel whose version moved an exact str. Anything else returns None before
 * anything is built: the Python function checks and raises its typed error. The record
 * is a new dict (the checkpoint minus values, versions and id), values a new dict. */
static PyObject *s_configurable, *s_thread_id, *s_checkpoint_ns, *s_checkpoint_id, *s_id,
    *s_channel_values, *s_channel_versions;

/* config["configurable"], its thread id and namespace (borrowed; the namespace
 * `conf.get("checkpoint_ns") or ""`) where they have LangGraph's plain shape: 1 taken,
 * 0 not this path's (the Python function decides), -1 an error raised. */
static int conf_ids(PyObject *config, PyObject **conf, PyObject **tid, PyObject **ns)
{
    *conf = PyDict_GetItemWithError(config, s_configurable);
    if (*conf == NULL || !PyDict_CheckExact(*conf))
        return PyErr_Occurred() ? -1 : 0;
    *tid = PyDict_GetItemWithError(*conf, s_thread_id);
    if (*tid == NULL || !PyUnicode_CheckExact(*tid) || PyUnicode_GET_LENGTH(*tid) == 0)
        return PyErr_Occurred() ? -1 : 0;
    *ns = PyDict_GetItemWithError(*conf, s_checkpoint_ns);
    if (*ns == NULL && PyErr_Occurred())
        return -1;
    if (*ns == NULL || *ns == Py_None)
        *ns = empty_str;
    else if (!PyUnicode_CheckExact(*ns))
        return 0;
    return 1;
}

static PyObject *put_args(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "put_args() takes 5 arguments");
        return NULL;
    }
    PyObject *config = a[0], *ck = a[1], *metadata = a[2], *new_versions = a[3];
    PyObject *empty = a[4];
    if (!PyDict_CheckExact(config) || !PyDict_CheckExact(ck) || !PyDict_CheckExact(metadata)
            || !PyDict_CheckExact(new_versions))
        Py_RETURN_NONE;
    PyObject *conf, *tid, *ns;                                              /* borrowed */
    int taken = conf_ids(config, &conf, &tid, &ns);
    if (taken <= 0) {
        if (taken < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *cid = PyDict_GetItemWithError(ck, s_id);
    PyObject *all_values = cid == NULL ? NULL : PyDict_GetItemWithError(ck, s_channel_values);
    PyObject *versions = all_values == NULL ? NULL
        : PyDict_GetItemWithError(ck, s_channel_versions);
    if (versions == NULL || !PyUnicode_CheckExact(cid) || !PyDict_CheckExact(all_values)
            || !PyDict_CheckExact(versions)) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *parent = PyDict_GetItemWithError(conf, s_checkpoint_id);
    if (parent == NULL && PyErr_Occurred())
        return NULL;
    if (parent == NULL)
        parent = Py_None;
    /* the channels whose version moved: every one for a root (it inherits nothing) */
    PyObject *changed = parent == Py_None ? versions : new_versions;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(changed, &pos, &k, &v))
        if (!PyUnicode_CheckExact(k))
            Py_RETURN_NONE;
    PyObject *record = PyDict_Copy(ck), *values = NULL, *out = NULL;
    if (record == NULL || PyDict_DelItem(record, s_channel_values)
            || PyDict_DelItem(record, s_channel_versions) || PyDict_DelItem(record, s_id))
        goto done;
    values = PyDict_New();
    if (values == NULL)
        goto done;
    pos = 0;
    while (PyDict_Next(changed, &pos, &k, &v)) {
        PyObject *x = PyDict_GetItemWithError(all_values, k);
        if (x == NULL && PyErr_Occurred())
            goto done;
        if (PyDict_SetItem(values, k, x == NULL ? empty : x))
            goto done;
    }
    out = PyTuple_Pack(9, conf, tid, ns, cid, all_values, record, versions, parent, values);
done:
    Py_XDECREF(record);
    Py_XDECREF(values);
    return out;
}

/* put_writes_args(config, writes, idx_map, deque) -> (conf, thread_id, ns, cid, items) | None
 *
 * kernel/langgraph.py's put_writes_args_py for what LangGraph passes: config and its
 * "configurable" exact dicts, a non-empty exact str thread id, the namespace missing, None
 * or an exact str, an exact str checkpoint id, idx_map an exact dict, and writes an exact
 * list, tuple or collections.deque (walked by its C iterator) of exact (str, value) tuples.
 * items is [(idx_map.get(ch, i), ch, v) for i, (ch, v) in enumerate(writes)]. Anything
 * else returns None, nothing built: the Python function checks and raises. */
static PyObject *put_writes_args(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "put_writes_args() takes 4 arguments");
        return NULL;
    }
    PyObject *config = a[0], *writes = a[1], *idx_map = a[2], *deque = a[3];
    if (!PyDict_CheckExact(config) || !PyDict_CheckExact(idx_map)
            || !(PyList_CheckExact(writes) || PyTuple_CheckExact(writes)
                 || (PyObject *)Py_TYPE(writes) == deque))
        Py_RETURN_NONE;
    PyObject *conf, *tid, *ns;                                              /* borrowed */
    int taken = conf_ids(config, &conf, &tid, &ns);
    if (taken <= 0) {
        if (taken < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *cid = PyDict_GetItemWithError(conf, s_checkpoint_id);
    if (cid == NULL || !PyUnicode_CheckExact(cid)) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    /* a copy of the writes first (a deque's iterator is C: no Python code runs) */
    PyObject *seq = PySequence_List(writes);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PyList_GET_ITEM(seq, i);
        if (!PyTuple_CheckExact(w) || PyTuple_GET_SIZE(w) != 2
                || !PyUnicode_CheckExact(PyTuple_GET_ITEM(w, 0))) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
    }
    PyObject *items = PyList_New(n), *out = NULL;
    if (items == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *w = PyList_GET_ITEM(seq, i);
        PyObject *ch = PyTuple_GET_ITEM(w, 0);
        PyObject *idx = PyDict_GetItemWithError(idx_map, ch);
        if (idx == NULL && PyErr_Occurred())
            goto done;
        PyObject *x = idx != NULL ? Py_BuildValue("(OOO)", idx, ch, PyTuple_GET_ITEM(w, 1))
                                  : Py_BuildValue("(nOO)", i, ch, PyTuple_GET_ITEM(w, 1));
        if (x == NULL)
            goto done;
        PyList_SET_ITEM(items, i, x);
    }
    out = PyTuple_Pack(5, conf, tid, ns, cid, items);
done:
    Py_XDECREF(items);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"put_args", (PyCFunction)(void (*)(void))put_args, METH_FASTCALL,
     "put_args(config, checkpoint, metadata, new_versions, empty) -> (conf, thread_id, ns, "
     "cid, all_values, record, versions, parent_id, values) or None: DurkvSaver.put's "
     "arguments for plain dicts."},
    {"put_writes_args", (PyCFunction)(void (*)(void))put_writes_args, METH_FASTCALL,
     "put_writes_args(config, writes, idx_map, deque) -> (conf, thread_id, ns, cid, items) "
     "or None: DurkvSaver.put_writes' arguments for plain dicts and (str, value) writes."},
    {"checkpoint_metadata", checkpoint_metadata, METH_VARARGS,
     "checkpoint_metadata(config, metadata, excluded, chainmap) -> dict or None: "
     "durkv.langgraph.checkpoint_metadata for plain dicts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._lgcommit",
    "DurkvSaver's commit path, the LangGraph side, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lgcommit(void)
{
    plain_attr = PyUnicode_InternFromString("_plain");
    none_attr = PyUnicode_InternFromString("_none");
    maps_attr = PyUnicode_InternFromString("maps");
    nul_str = PyUnicode_FromOrdinal(0);
    empty_str = PyUnicode_FromString("");
    s_configurable = PyUnicode_InternFromString("configurable");
    s_thread_id = PyUnicode_InternFromString("thread_id");
    s_checkpoint_ns = PyUnicode_InternFromString("checkpoint_ns");
    s_checkpoint_id = PyUnicode_InternFromString("checkpoint_id");
    s_id = PyUnicode_InternFromString("id");
    s_channel_values = PyUnicode_InternFromString("channel_values");
    s_channel_versions = PyUnicode_InternFromString("channel_versions");
    if (s_configurable == NULL || s_thread_id == NULL || s_checkpoint_ns == NULL
            || s_checkpoint_id == NULL || s_id == NULL || s_channel_values == NULL
            || s_channel_versions == NULL)
        return NULL;
    if (plain_attr == NULL || none_attr == NULL || maps_attr == NULL || nul_str == NULL
            || empty_str == NULL || PyType_Ready(&DumpsType) < 0)
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
