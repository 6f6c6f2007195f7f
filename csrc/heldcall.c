/* durkv._heldcall: the segment log's short calls of a commit, made with the GIL held.
 *
 * bind(begin_try, append_try, end_try, one_try): the addresses of dkv_write_begin_try,
 * dkv_append_try, dkv_write_end_try and dkv_append_one_try in durkv._seglog (durkv.log
 * binds them at import). Then, each a C call that keeps the caller's GIL:
 *
 *   begin(addr) -> rc                       dkv_write_begin_try(log)
 *   append(addr, type, payload, dur) -> r   dkv_append_try(log, type, payload, dur)
 *   end(addr) -> rc                         dkv_write_end_try(log, 0)
 *   end_async(addr) -> rc                   dkv_write_end_try(log, 1)
 *   append_one(addr, type, payload, dur, expect) -> r
 *                                           dkv_append_one_try(log, ..., expect)
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
 * section, WLOCK, a catch-up), and the long ones too, so that other threads are not held
 * up (an fdatasync, a roll, a long write, another leader's write, a mutex held past a
 * short spin); what they wait for is the log's own short work, which never takes a GIL
 * (csrc/seglog.h).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*begin_fn)(void *);
typedef int (*end_fn)(void *, int);
typedef int64_t (*append_fn)(void *, uint8_t, const char *, uint32_t, int);
typedef int64_t (*append_one_fn)(void *, uint8_t, const char *, uint32_t, int, uint64_t);

static begin_fn begin_try;
static end_fn end_try;
static append_fn append_try;
static append_one_fn append_one_try;

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
        PyErr_SetString(PyExc_TypeError, "bind(begin_try, append_try, end_try, one_try)");
        return NULL;
    }
    void *f[4];
    for (int i = 0; i < 4; i++)
        if ((f[i] = address(args[i])) == NULL)
            return NULL;
    begin_try = (begin_fn)(uintptr_t)f[0];
    append_try = (append_fn)(uintptr_t)f[1];
    end_try = (end_fn)(uintptr_t)f[2];
    append_one_try = (append_one_fn)(uintptr_t)f[3];
    Py_RETURN_NONE;
}

/* 0 when a call of `n` arguments (`want` wanted) may go to `fn`, else -1 with an error */
static int callable_with(const void *fn, Py_ssize_t n, Py_ssize_t want, const char *usage)
{
    if (n != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, not %zd", usage, want, n);
        return -1;
    }
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "durkv._heldcall is not bound (durkv.log binds it)");
        return -1;
    }
    return 0;
}

static PyObject *begin(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = callable_with((const void *)begin_try, n, 1, "begin(addr)") ? NULL
                : address(args[0]);
    return log ? PyLong_FromLong(begin_try(log)) : NULL;
}

static PyObject *end(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = callable_with((const void *)end_try, n, 1, "end(addr)") ? NULL
                : address(args[0]);
    return log ? PyLong_FromLong(end_try(log, 0)) : NULL;
}

static PyObject *end_async(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    void *log = callable_with((const void *)end_try, n, 1, "end_async(addr)") ? NULL
                : address(args[0]);
    return log ? PyLong_FromLong(end_try(log, 1)) : NULL;
}

/* A frame's arguments, args[0..3] = (addr, type, payload, durability), of a call of `n`
 * arguments to `fn`: 0, or -1 with an exception. */
typedef struct {
    void *log;
    uint8_t type;
    const char *buf;
    uint32_t len;
    int dur;
} frame_t;

static int frame_args(const void *fn, PyObject *const *args, Py_ssize_t n, Py_ssize_t want,
                      const char *usage, frame_t *f)
{
    if (callable_with(fn, n, want, usage) || (f->log = address(args[0])) == NULL)
        return -1;
    long t = PyLong_AsLong(args[1]);
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (!PyBytes_CheckExact(args[2])) {
        PyErr_Format(PyExc_TypeError, "payload must be bytes, not %.80s",
                     Py_TYPE(args[2])->tp_name);
        return -1;
    }
    long d = PyLong_AsLong(args[3]);
    if (d == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t len = PyBytes_GET_SIZE(args[2]);
    if (t < 0 || t > 255 || d < -1 || d > 2 || (uint64_t)len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "append: frame type, durability or length out of range");
        return -1;
    }
    f->type = (uint8_t)t;
    f->buf = PyBytes_AS_STRING(args[2]);
    f->len = (uint32_t)len;
    f->dur = (int)d;
    return 0;
}

static PyObject *append(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    frame_t f;
    if (frame_args((const void *)append_try, args, n, 4,
                   "append(addr, type, payload, durability)", &f))
        return NULL;
    return PyLong_FromLongLong(append_try(f.log, f.type, f.buf, f.len, f.dur));
}

static PyObject *append_one(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    frame_t f;
    if (frame_args((const void *)append_one_try, args, n, 5,
                   "append_one(addr, type, payload, durability, expect)", &f))
        return NULL;
    unsigned long long expect = PyLong_AsUnsignedLongLong(args[4]);
    if (expect == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(append_one_try(f.log, f.type, f.buf, f.len, f.dur,
                                              (uint64_t)expect));
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(begin_try, append_try, end_try, one_try): the log functions' addresses."},
    {"begin", (PyCFunction)(void (*)(void))begin, METH_FASTCALL,
     "begin(addr) -> dkv_write_begin_try's result, the GIL held."},
    {"append", (PyCFunction)(void (*)(void))append, METH_FASTCALL,
     "append(addr, type, payload, durability) -> dkv_append_try's result, the GIL held."},
    {"append_one", (PyCFunction)(void (*)(void))append_one, METH_FASTCALL,
     "append_one(addr, type, payload, durability, expect) -> dkv_append_one_try's result."},
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
