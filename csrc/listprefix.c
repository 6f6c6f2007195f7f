/* durkv._listprefix: is one Python list a prefix of another, exactly and fast.
 *
 * The store writes a list channel as a delta when the new list keeps the old one as
 * its prefix (kernel/delta.py). Reducers like operator.add build the new list from the
 * same item objects, so the two item-pointer arrays are byte-identical: one memcmp
 * (~0.1 ns per item) proves it. Where pointers differ, the items are compared with ==
 * (PyObject_RichCompareBool, identity first), exactly as list == list would, so the
 * answer is always the exact one and nothing is allocated.
 *
 * This is a CPython extension, separate from the cffi segment log: it reads list
 * internals (PySequence_Fast_ITEMS), which cffi cannot.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* has_prefix(new, old, n) -> bool: len(new) >= n, len(old) >= n, new[:n] == old[:n]. */
static PyObject *has_prefix(PyObject *self, PyObject *args)
{
    PyObject *a, *b;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &a, &PyList_Type, &b, &n))
        return NULL;
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
        Py_INCREF(u);                  /* __eq__ may run Python code that mutates the lists */
        Py_INCREF(v);
        int eq = PyObject_RichCompareBool(u, v, Py_EQ);
        Py_DECREF(u);
        Py_DECREF(v);
        if (eq < 0)
            return NULL;
        if (!eq)
            Py_RETURN_FALSE;
        if (PyList_GET_SIZE(a) < n || PyList_GET_SIZE(b) < n)   /* mutated by __eq__ */
            Py_RETURN_FALSE;
        x = PySequence_Fast_ITEMS(a);
        y = PySequence_Fast_ITEMS(b);
        i++;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"has_prefix", has_prefix, METH_VARARGS,
     "has_prefix(new, old, n) -> bool: both lists have n items and new[:n] == old[:n]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._listprefix",
    "Exact, allocation-free list prefix test for delta encoding.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listprefix(void)
{
    return PyModule_Create(&module);
}
