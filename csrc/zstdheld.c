/* durkv._zstdheld: zstd compression with the GIL held, through the system's libzstd.
 *
 *   available -> bool             libzstd.so.1 (>= 1.4) was found and bound at import
 *   Compressor(level, dict=None, checksum=False)
 *       .compress(data) -> bytes  one zstd frame of ``data`` (its content size written)
 *
 * ``data`` of RELEASE_OVER bytes or more is compressed with the GIL released, as
 * ``zstandard`` does: its time is worth a hand-off, and other threads go on meanwhile.
 *
 * With ``dict`` the frame is compressed against those bytes as a raw-content dictionary
 * and names no dictionary id: what durkv.store.ckpthead's deltas are (docs/FORMAT.md 5).
 * Any zstd decoder reads the frames back (durkv reads with the ``zstandard`` package), so
 * which library wrote a frame is the writer's choice alone.
 *
 * Why: ``zstandard``'s compress releases the GIL around the C call, and on a commit's
 * thread each release wakes a graph's loop thread that waits for the GIL (see
 * csrc/heldcall.c; docs/BENCHMARKS.md, "Issue 20: the GIL-held commit path"). A
 * commit's items are small (a ~1 KiB message, a ~400 B checkpoint head): compressing
 * one costs a few microseconds, less than the hand-off. The library is loaded with dlopen
 * (no zstd headers are needed to build durkv); where it is missing ``available`` is False
 * and durkv.payload compresses with ``zstandard`` as before. A Compressor is used by one
 * thread at a time, as a ``zstandard`` compressor is (durkv's callers keep one per thread
 * or lock it); a call that finds another under way raises instead of sharing its context.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

/* the stable zstd API's names and values used here (zstd.h, 1.4 and later) */
#define ZSTD_c_compressionLevel 100
#define ZSTD_c_contentSizeFlag 200
#define ZSTD_c_checksumFlag 201
#define ZSTD_c_dictIDFlag 202

#define DICT_MAGIC "\x37\xa4\x30\xec"     /* ZSTD_MAGIC_DICTIONARY, little-endian */

#define RELEASE_OVER (64 << 10)

static struct {
    void *(*createCCtx)(void);
    size_t (*freeCCtx)(void *);
    void *(*createCDict)(const void *, size_t, int);
    size_t (*freeCDict)(void *);
    size_t (*setParameter)(void *, int, int);
    size_t (*refCDict)(void *, const void *);
    size_t (*compress2)(void *, void *, size_t, const void *, size_t);
    size_t (*compressBound)(size_t);
    unsigned (*isError)(size_t);
    const char *(*getErrorName)(size_t);
    unsigned (*versionNumber)(void);
} Z;

static int bind_libzstd(void)
{
    void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return 0;
#define SYM(field, name) \
    if ((*(void **)&Z.field = dlsym(h, name)) == NULL) \
        return 0;
    SYM(createCCtx, "ZSTD_createCCtx")
    SYM(freeCCtx, "ZSTD_freeCCtx")
    SYM(createCDict, "ZSTD_createCDict")
    SYM(freeCDict, "ZSTD_freeCDict")
    SYM(setParameter, "ZSTD_CCtx_setParameter")
    SYM(refCDict, "ZSTD_CCtx_refCDict")
    SYM(compress2, "ZSTD_compress2")
    SYM(compressBound, "ZSTD_compressBound")
    SYM(isError, "ZSTD_isError")
    SYM(getErrorName, "ZSTD_getErrorName")
    SYM(versionNumber, "ZSTD_versionNumber")
#undef SYM
    /* the handle stays open: the functions are used for the life of the process */
    return Z.versionNumber() >= 10400;
}

typedef struct {
    PyObject_HEAD
    void *cctx;
    void *cdict;
    int busy;       /* a compress with the GIL released is under way */
} Compressor;

static int zfail(size_t r, const char *what)
{
    if (!Z.isError(r))
        return 0;
    PyErr_Format(PyExc_RuntimeError, "zstd %s: %s", what, Z.getErrorName(r));
    return -1;
}

static void comp_dealloc(Compressor *c)
{
    if (c->cctx)
        Z.freeCCtx(c->cctx);
    if (c->cdict)
        Z.freeCDict(c->cdict);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int comp_init(Compressor *c, PyObject *args, PyObject *kw)
{
    static char *names[] = {"level", "dict", "checksum", NULL};
    int level, checksum = 0;
    Py_buffer dict = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|z*p:Compressor", names, &level, &dict,
                                     &checksum))
        return -1;
    int rc = -1;
    if (Z.createCCtx == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "libzstd.so.1 (1.4 or later) was not found: durkv._zstdheld is "
                        "unavailable (durkv.payload falls back to zstandard)");
        goto done;
    }
    if (c->cctx != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Compressor is initialized once");
        goto done;
    }
    if ((c->cctx = Z.createCCtx()) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (zfail(Z.setParameter(c->cctx, ZSTD_c_compressionLevel, level), "level")
            || zfail(Z.setParameter(c->cctx, ZSTD_c_checksumFlag, checksum), "checksum")
            || zfail(Z.setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1), "content size"))
        goto done;
    if (dict.buf != NULL) {
        /* ZSTD_createCDict reads bytes that begin with zstd's dictionary magic as a
         * formatted dictionary, any others as raw content; only raw content is asked for
         * here, and the stable API has no way to say so (durkv.payload hands such bytes
         * to zstandard, which does) */
        if (dict.len >= 4 && memcmp(dict.buf, DICT_MAGIC, 4) == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "dict begins with zstd's dictionary magic (37 a4 30 ec): libzstd "
                            "would not read it as raw content; compress with zstandard");
            goto done;
        }
        if ((c->cdict = Z.createCDict(dict.buf, (size_t)dict.len, level)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (zfail(Z.refCDict(c->cctx, c->cdict), "dictionary")
                || zfail(Z.setParameter(c->cctx, ZSTD_c_dictIDFlag, 0), "dictionary id"))
            goto done;
    }
    rc = 0;
done:
    if (dict.buf != NULL)
        PyBuffer_Release(&dict);
    return rc;
}

static PyObject *comp_compress(Compressor *c, PyObject *data)
{
    if (c->cctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Compressor not initialized");
        return NULL;
    }
    Py_buffer in;
    if (PyObject_GetBuffer(data, &in, PyBUF_SIMPLE) < 0)
        return NULL;
    if (c->busy) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_RuntimeError,
                        "a Compressor is used by one thread at a time: another compresses");
        return NULL;
    }
    size_t cap = Z.compressBound((size_t)in.len);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    if (out != NULL) {
        char *dst = PyBytes_AS_STRING(out);
        size_t n;
        if (in.len < RELEASE_OVER) {
            /* the GIL stays held: see the module comment */
            n = Z.compress2(c->cctx, dst, cap, in.buf, (size_t)in.len);
        } else {
            c->busy = 1;
            Py_BEGIN_ALLOW_THREADS
            n = Z.compress2(c->cctx, dst, cap, in.buf, (size_t)in.len);
            Py_END_ALLOW_THREADS
            c->busy = 0;
        }
        if (zfail(n, "compress"))
            Py_CLEAR(out);
        else if (n < cap)
            _PyBytes_Resize(&out, (Py_ssize_t)n);
    }
    PyBuffer_Release(&in);
    return out;
}

static PyMethodDef comp_methods[] = {
    {"compress", (PyCFunction)comp_compress, METH_O,
     "compress(data) -> bytes: one zstd frame of data, the GIL held."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CompressorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._zstdheld.Compressor",
    .tp_basicsize = sizeof(Compressor),
    .tp_dealloc = (destructor)comp_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Compressor(level, dict=None, checksum=False): zstd frames, the GIL held.",
    .tp_methods = comp_methods,
    .tp_init = (initproc)comp_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._zstdheld",
    "zstd compression with the GIL held, through libzstd.so.1 (see csrc/zstdheld.c).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__zstdheld(void)
{
    int ok = bind_libzstd();
    if (!ok)
        memset(&Z, 0, sizeof Z);
    if (PyType_Ready(&CompressorType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "available", ok ? Py_True : Py_False) < 0
            || PyModule_AddIntConstant(m, "RELEASE_OVER", RELEASE_OVER) < 0
            || PyModule_AddObjectRef(m, "Compressor", (PyObject *)&CompressorType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
