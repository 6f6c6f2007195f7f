/* durkv._heldcall: the segment log's short calls of a commit, made with the GIL held.
 *
 * bind(begin_try, append_try, end_try): the addresses of dkv_write_begin_try,
 * dkv_append_try and dkv_write_end_try in durkv._seglog (durkv.log binds them at import).
 * Then, each a C call that keeps the caller's GIL:
 *
 *   begin(addr) -> rc                       dkv_write_begin_try(log)
 *   append(addr, type, payload, dur) -> r   dkv_append_try(log, type, payload, dur)
 *   end(addr) -> rc                         dkv_write_end_try(log, 0)
 *   end_async(addr) -> rc                   dkv_write_end_try(log, 1)
 *
 * ``addr`` is a SegmentLog's ``_addr`` (its dkv_log *); ``payload`` bytes. The results are
 * the C functions' own; DKV_WOULD_WAIT means "would wait, or move 64 KiB or more": the
 * caller makes durkv._seglog's blocking call, which releases the GIL (durkv.log).
 *
 * Why: a cffi call releases the GIL around every C call. A LangGraph graph's loop thread
 * waits for that GIL while a saver commits on another thread; each release wakes it, and
 * a commit of four releases cost about twice its CPU inside a graph (docs/BENCHMARKS.md,
 * "Issue 20: the GIL-held commit path"). Holding the GIL is safe only where the call never
 * waits for a thread that may need it: the try calls refuse those waits (another thread's
 * section, WLOCK, a catch-up, an fdatasync, a long write), and what they wait for is the
 * log's own threads, which never take a GIL (csrc/seglog.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*begin_fn)(void *);
typedef int (*end_fn)(void *, int);
typedef int64_t (*append_fn)(void *, uint8_t, const char *, uint32_t, int);

static begin_fn begin_try;
static end_fn end_try;
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
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "bind(begin_try, append_try, end_try)");
        return NULL;
    }
    void *f[3];
    for (int i = 0; i < 3; i++)
        if ((f[i] = address(args[i])) == NULL)
            return NULL;
    begin_try = (begin_fn)(uintptr_t)f[0];
    append_try = (append_fn)(uintptr_t)f[1];
    end_try = (end_fn)(uintptr_t)f[2];
    Py_RETURN_NONE;
}

/* the log handle of a one-argument call (args[0]), or NULL with an exception */
static void *log_arg(const void *fn, PyObject *const *args, Py_ssize_t n, const char *name)
{
    if (n != 1) {
        PyErr_Format(PyExc_TypeError, "%s(addr) takes one argument", name);
        return NULL;
    }
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "durkv._heldcall is not bound (durkv.log binds it)");
        return NULL;
    }
    return address(args[0]);
}

static PyObject *begin(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = log_arg((const void *)begin_try, args, n, "begin");
    return log ? PyLong_FromLong(begin_try(log)) : NULL;
}

static PyObject *end(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = log_arg((const void *)end_try, args, n, "end");
    return log ? PyLong_FromLong(end_try(log, 0)) : NULL;
}

static PyObject *end_async(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = log_arg((const void *)end_try, args, n, "end_async");
    return log ? PyLong_FromLong(end_try(log, 1)) : NULL;
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
     "bind(begin_try, append_try, end_try): the log functions' addresses."},
    {"begin", (PyCFunction)(void (*)(void))begin, METH_FASTCALL,
     "begin(addr) -> dkv_write_begin_try's result, the GIL held."},
    {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL,
     "append(addr, type, payload, durability) -> dkv_append_try's result, the GIL held."},
    {"end", (PyCFunction)(void (*)(void))end, METH_FASTCALL,
     "end(addr) -> dkv_write_end_try(log, 0)'s result, the GIL held."},
    {"end_async", (PyCFunction)(void (*)(void))end_async, METH_FASTCALL,
     "end_async(addr) -> dkv_write_end_try(log, 1)'s result, the GIL held."},
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
