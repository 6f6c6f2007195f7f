/* durkv._heldcall: the segment log's short calls of a commit, made with the GIL held.
 *
 * bind(begin_try, append_try, end, end_async): the addresses of dkv_write_begin_try,
 * dkv_append_try, dkv_write_end and dkv_write_end_async in durkv._seglog (durkv.log
 * binds them at import). Then, each a C call that keeps the caller's GIL:
 *
 *   begin(addr) -> rc                       dkv_write_begin_try(log)
 *   append(addr, type, payload, dur) -> r   dkv_append_try(log, type, payload, dur)
 *   end(addr) -> rc                         dkv_write_end(log)
 *   end_async(addr) -> rc                   dkv_write_end_async(log)
 *
 * ``addr`` is a SegmentLog's ``_addr`` (its dkv_log *); ``payload`` bytes. The results are
 * the C functions' own; DKV_WOULD_WAIT from the two try calls means "would wait": the caller
 * makes durkv._seglog's blocking call, which releases the GIL (durkv.log).
 *
 * Why: a cffi call releases the GIL around every C call. A LangGraph graph's loop thread
 * waits for that GIL while a saver commits on another thread; each release wakes it, and
 * a commit of four releases cost about twice its CPU inside a graph (docs/BENCHMARKS.md,
 * "Issue 20: the GIL-held commit path"). Holding the GIL is safe only where the call never
 * waits for a thread that may need it: the try calls refuse those waits (another thread's
 * section, WLOCK, a catch-up, an fdatasync), and the section's end waits only for the
 * log's own threads, which never take a GIL (csrc/seglog.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*log_fn)(void *);
typedef int64_t (*append_fn)(void *, uint8_t, const char *, uint32_t, int);

static log_fn begin_try, end_sync, end_async;
static append_fn append_try;

static void *address(PyObject *o)
{
    if (!PyLong_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "an address is an int, not %.80s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a null address");
    return p;
}

static PyObject *bind(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "bind(begin_try, append_try, end, end_async)");
        return NULL;
    }
    void *f[4];
    for (int i = 0; i < 4; i++)
        if ((f[i] = address(args[i])) == NULL)
            return NULL;
    begin_try = (log_fn)(uintptr_t)f[0];
    append_try = (append_fn)(uintptr_t)f[1];
    end_sync = (log_fn)(uintptr_t)f[2];
    end_async = (log_fn)(uintptr_t)f[3];
    Py_RETURN_NONE;
}

/* one log call on `addr` (args[0]) with the GIL held */
static PyObject *call_log(log_fn fn, PyObject *const *args, Py_ssize_t n, const char *name)
{
    if (n != 1) {
        PyErr_Format(PyExc_TypeError, "%s(addr) takes one argument", name);
        return NULL;
    }
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "durkv._heldcall is not bound (durkv.log binds it)");
        return NULL;
    }
    void *log = address(args[0]);
    if (log == NULL)
        return NULL;
    return PyLong_FromLong(fn(log));
}

static PyObject *begin(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    return call_log(begin_try, args, n, "begin");
}

static PyObject *end(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    return call_log(end_sync, args, n, "end");
}

static PyObject *end_async_(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    return call_log(end_async, args, n, "end_async");
}

static PyObject *append(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "append(addr, type, payload, durability)");
        return NULL;
    }
    if (append_try == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "durkv._heldcall is not bound (durkv.log binds it)");
        return NULL;
    }
    void *log = address(args[0]);
    if (log == NULL)
        return NULL;
    long type = PyLong_AsLong(args[1]);
    if (type == -1 && PyErr_Occurred())
        return NULL;
    if (!PyBytes_CheckExact(args[2])) {
        PyErr_Format(PyExc_TypeError, "payload must be bytes, not %.80s",
                     Py_TYPE(args[2])->tp_name);
        return NULL;
    }
    long dur = PyLong_AsLong(args[3]);
    if (dur == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t len = PyBytes_GET_SIZE(args[2]);
    if (type < 0 || type > 255 || dur < -1 || dur > 2 || (uint64_t)len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "append: frame type, durability or length out of range");
        return NULL;
    }
    return PyLong_FromLongLong(append_try(log, (uint8_t)type, PyBytes_AS_STRING(args[2]),
                                          (uint32_t)len, (int)dur));
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(begin_try, append_try, end, end_async): the log functions' addresses."},
    {"begin", (PyCFunction)(void (*)(void))begin, METH_FASTCALL,
     "begin(addr) -> dkv_write_begin_try's result, the GIL held."},
    {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL,
     "append(addr, type, payload, durability) -> dkv_append_try's result, the GIL held."},
    {"end", (PyCFunction)(void (*)(void))end, METH_FASTCALL,
     "end(addr) -> dkv_write_end's result, the GIL held."},
    {"end_async", (PyCFunction)(void (*)(void))end_async_, METH_FASTCALL,
     "end_async(addr) -> dkv_write_end_async's result, the GIL held."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._heldcall",
    "The segment log's short commit calls, the GIL held (see csrc/heldcall.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__heldcall(void)
{
    return PyModule_Create(&module);
}
