/* durkv._chanenc: one channel of a put encoded in one C call (kernel/store/delta.py).
 *
 * ChanEncoder(encoder, dumps, compress, min_bytes, chan_state, has_prefix, wrap, serde) is
 * called as ``enc(ch, v, prev, lsn, entries, pend)`` -- the arguments of
 * ChannelEncoder.encode, which stays the definition -- and returns the new ChanState, or
 * None before doing anything when the case is not one it takes:
 *
 *   - a value that is not a list: one FULL entry with flag VALUE (zstd when large);
 *   - an exact list, under delta_check="prefix", whose previous state ``prev`` is None,
 *     not a list, or a loaded list: a DELTA on it when it extends it (the F_REFS DELTA
 *     naming the parent's pending writes that hold its first items, a DELTA of its own
 *     items, a SNAP every snapshot_every deltas), else a FULL entry of one item per
 *     element.
 *
 * Left to Python: a list subclass, delta_check="identity", a ``prev`` known by its ref
 * only (the Python path loads it from the log first). The entries, the ChanState's
 * fields and the store's own item arrays are built as the Python methods build them
 * (encode, _encode_list, delta_start, _serialize_items, _match_writes, _stored_items,
 * _keep_items, _append_deltas); tests/test_chanenc.py compares the two over
 * hostile values and whole stores' log bytes. An exception the Python path turns into a
 * SerializationError (the serializer's, the codec's on a list item) is turned into the
 * same one by ``wrap(ch, exc)``; any other propagates as it is.
 *
 * Why in C: a LangGraph superstep encodes ~3 channels, and the Python path ran ~12
 * small methods a list delta (docs/BENCHMARKS.md, "Issue 20: DurkvSaver's put and
 * put_writes in C"). It keeps the GIL (dumps and compress are Python objects). The
 * ChanState keeps the store's own arrays and the items put, as the Python path does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "plaincopy.h"

enum { FULL = 1, DELTA = 2, SNAP = 3 };
enum { F_ZSTD = 1, F_VALUE = 2, F_REFS = 4 };

static const char ZSTD_MAGIC[4] = {0x28, (char)0xb5, 0x2f, (char)0xfd};
static const char JREF_MAGIC[4] = {(char)0xc1, 0x6a, 0x72, 0x66};   /* payload.JREF_MAGIC */

static PyObject *s_loaded, *s_is_list, *s_obj, *s_raw, *s_as_is, *s_n, *s_first, *s_last,
    *s_mid, *s_vbytes, *s_base, *s_deltas, *s_fresh, *s_ref, *s_snapshot_every,
    *s_prefix_check, *s_plain_tag, *s_rewritten, *empty_args;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *encoder, *dumps, *compress, *chan_state, *has_prefix, *wrap;
    PyObject *serde;        /* its plain_tag: the tag of items kept as copies, or None */
    Py_ssize_t min_bytes;
} ChanEnc;

/* pack_ref(lsn, idx): payload.py's struct "<QI" */
static PyObject *ref_bytes(unsigned long long lsn, unsigned long long idx)
{
    if (idx > 0xffffffffULL) {
        PyErr_SetString(PyExc_OverflowError, "entry index over 2**32-1");
        return NULL;
    }
    unsigned char b[12];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(lsn >> (8 * i));
    for (int i = 0; i < 4; i++)
        b[8 + i] = (unsigned char)(idx >> (8 * i));
    return PyBytes_FromStringAndSize((const char *)b, 12);
}

/* pack_ref(*r) of a 2-tuple/list of ints */
static PyObject *ref_of(PyObject *r)
{
    PyObject *seq = PySequence_Fast(r, "a ref is (lsn, idx)");
    if (seq == NULL)
        return NULL;
    PyObject *out = NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 2) {
        PyErr_SetString(PyExc_TypeError, "a ref is (lsn, idx)");
    } else {
        unsigned long long a = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, 0));
        unsigned long long b = a == (unsigned long long)-1 && PyErr_Occurred() ? 0
            : PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, 1));
        if (!PyErr_Occurred())
            out = ref_bytes(a, b);
    }
    Py_DECREF(seq);
    return out;
}

static int set(PyObject *o, PyObject *name, PyObject *v)
{
    return PyObject_SetAttr(o, name, v);
}

/* set and drop the reference (v may be NULL: an error already set) */
static int set_new(PyObject *o, PyObject *name, PyObject *v)
{
    if (v == NULL)
        return -1;
    int rc = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return rc;
}

/* an entry tuple (kind, items, flags, depth, prev_lsn, prev_idx) appended; steals items */
static int add_entry(PyObject *entries, long kind, PyObject *items, long flags,
                     Py_ssize_t depth, PyObject *pl, PyObject *pi)
{
    if (items == NULL)
        return -1;
    PyObject *e = pl == NULL
        ? Py_BuildValue("(lNlnii)", kind, items, flags, depth, 0, 0)
        : Py_BuildValue("(lNlnOO)", kind, items, flags, depth, pl, pi);
    if (e == NULL)
        return -1;
    int rc = PyList_Append(entries, e);
    Py_DECREF(e);
    return rc;
}

/* 1 when a serialized item is stored compressed: len(b) >= min_bytes, or b[:4] is zstd's
 * or a jref's magic (docs/FORMAT.md 5) */
static int wants_zstd(PyObject *b, Py_ssize_t min_bytes)
{
    if (PyBytes_CheckExact(b)) {
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        return n >= min_bytes || (n >= 4 && (memcmp(PyBytes_AS_STRING(b), ZSTD_MAGIC, 4) == 0
                                             || memcmp(PyBytes_AS_STRING(b), JREF_MAGIC, 4) == 0));
    }
    Py_ssize_t n = PyObject_Length(b);
    if (n < 0)
        return -1;
    if (n >= min_bytes)
        return 1;
    PyObject *head = PySequence_GetSlice(b, 0, 4);
    if (head == NULL)
        return -1;
    int eq = 0;
    for (int m = 0; m < 2 && eq == 0; m++) {
        PyObject *magic = PyBytes_FromStringAndSize(m ? JREF_MAGIC : ZSTD_MAGIC, 4);
        eq = magic == NULL ? -1 : PyObject_RichCompareBool(head, magic, Py_EQ);
        Py_XDECREF(magic);
    }
    Py_DECREF(head);
    return eq;
}

/* a non-list value: FULL with flag VALUE. Python wraps only the serializer's error. */
static PyObject *encode_value(ChanEnc *e, PyObject *v, PyObject *c,
                              unsigned long long lsn, Py_ssize_t idx, PyObject *entries,
                              int *wrap)
{
    *wrap = 1;
    PyObject *raw = PyObject_CallOneArg(e->dumps, v);
    if (raw == NULL)
        return NULL;
    *wrap = 0;
    long flags = F_VALUE;
    PyObject *b = raw;
    Py_INCREF(b);
    int z = wants_zstd(raw, e->min_bytes);
    if (z < 0)
        goto fail;
    if (z) {
        Py_SETREF(b, PyObject_CallOneArg(e->compress, raw));
        if (b == NULL)
            goto fail;
        flags |= F_ZSTD;
    }
    PyObject *items = PyList_New(1);
    if (items == NULL)
        goto fail;
    PyList_SET_ITEM(items, 0, b);
    b = NULL;
    if (add_entry(entries, FULL, items, flags, 0, NULL, NULL))
        goto fail;
    if (set(c, s_vbytes, raw) || set_new(c, s_base, ref_bytes(lsn, (unsigned long long)idx)))
        goto fail;
    Py_DECREF(raw);
    Py_INCREF(c);
    return c;
fail:
    Py_XDECREF(b);
    Py_DECREF(raw);
    return NULL;
}

/* delta_start under "prefix": len(old) if v extends prev's list, else -1; -2 on error */
static Py_ssize_t delta_start(ChanEnc *e, PyObject *prev, PyObject *v)
{
    PyObject *no = PyObject_GetAttr(prev, s_n);
    if (no == NULL)
        return -2;
    Py_ssize_t n = PyLong_AsSsize_t(no);
    Py_DECREF(no);
    if (n == -1 && PyErr_Occurred())
        return -2;
    if (PyList_GET_SIZE(v) < n)
        return -1;
    PyObject *rw = PyObject_GetAttr(prev, s_rewritten);   /* ChanState.rewritten */
    if (rw == NULL)
        return -2;
    int rewritten = PyObject_IsTrue(rw);
    Py_DECREF(rw);
    if (rewritten)
        return rewritten < 0 ? -2 : -1;
    if (n == 0)
        return 0;
    PyObject *old = PyObject_GetAttr(prev, s_obj);
    if (old == NULL)
        return -2;
    PyObject *kept = PyObject_GetAttr(prev, s_raw);     /* what the state keeps of each */
    if (kept == NULL) {
        Py_DECREF(old);
        return -2;
    }
    PyObject *nn = PyLong_FromSsize_t(n);
    PyObject *r = nn == NULL ? NULL
        : PyObject_CallFunctionObjArgs(e->has_prefix, v, old, nn, kept, NULL);
    Py_XDECREF(nn);
    Py_DECREF(kept);
    Py_DECREF(old);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -2;
        PyErr_Clear();          /* as `except Exception: return None` */
        return -1;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (t < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -2;
        PyErr_Clear();
        return -1;
    }
    return t ? n : -1;
}

/* _serialize_items(v, start): ([dumps(v[i]) ...], [what the state keeps of v[i] ...]) for
 * i in range(start, len(v)), len(v) taken once (v[i] of the live list). Kept: None for an
 * immutable scalar; for plain data under a plain_tag, durkv's decoded-form copy, taken
 * before dumps and serialized itself (so bytes and copy are one value), when its bytes
 * are the tag's; else the bytes. */
static PyObject *serialize_items(ChanEnc *e, PyObject *v, Py_ssize_t start, PyObject **kept)
{
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *raws = PyList_New(0), *keep = PyList_New(0);
    if (raws == NULL || keep == NULL)
        goto fail;
    int tag = -1;       /* read at every put: a serializer swapped in place is followed */
    PyObject *t = PyObject_GetAttr(e->serde, s_plain_tag);
    if (t == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto fail;
        PyErr_Clear();
    } else {
        if (t != Py_None)
            tag = (int)PyLong_AsLong(t);
        Py_DECREF(t);
        if (tag == -1 && PyErr_Occurred())
            goto fail;
    }
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *x = PyList_GetItem(v, i);     /* IndexError if dumps shortened it */
        if (x == NULL)
            goto fail;
        PyObject *cp = NULL;
        /* delta.py _SCALARS: its own copy, unless the serde reads it back as another
         * value (under LangGraph's: a str with a surrogate, an int past 64 bits) */
        if (plain_leaf_type(Py_TYPE(x)) && (tag < 0 || plain_leaf_round_trips(x))) {
            cp = Py_None;
            Py_INCREF(cp);
        } else if (tag >= 0 && (cp = plain_copy(x, PLAIN_AS_DECODED)) == NULL
                   && PyErr_Occurred()) {
            goto fail;
        }
        PyObject *src = cp != NULL && cp != Py_None ? cp : x;
        Py_INCREF(src);
        PyObject *r = PyObject_CallOneArg(e->dumps, src);
        Py_DECREF(src);
        if (r == NULL) {
            Py_XDECREF(cp);
            goto fail;
        }
        if (cp != NULL && cp != Py_None && !(PyBytes_Check(r) && PyBytes_GET_SIZE(r) >= 1
                && (unsigned char)PyBytes_AS_STRING(r)[0] == (unsigned char)tag))
            Py_CLEAR(cp);                   /* the serde wrote it another way: keep bytes */
        int bad = PyList_Append(raws, r) || PyList_Append(keep, cp != NULL ? cp : r);
        Py_DECREF(r);
        Py_XDECREF(cp);
        if (bad)
            goto fail;
    }
    *kept = keep;
    return raws;
fail:
    Py_XDECREF(raws);
    Py_XDECREF(keep);
    return NULL;
}

/* _match_writes(pend, raws): the refs of the pending writes whose items, one after another,
 * are a prefix of raws; *m the items covered. New reference to the refs list. */
static PyObject *match_writes(PyObject *pend, PyObject *raws, Py_ssize_t *m_out)
{
    Py_ssize_t nr = PyList_GET_SIZE(raws), m = 0;
    PyObject *refs = PyList_New(0);
    if (refs == NULL)
        return NULL;
    if (PyList_GET_SIZE(pend) == 1 && nr) {
        PyObject *p = PyList_GET_ITEM(pend, 0);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2)
            goto bad;
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(p, 1), raws, Py_EQ);
        if (eq < 0)
            goto fail;
        if (eq) {
            if (PyList_Append(refs, PyTuple_GET_ITEM(p, 0)))
                goto fail;
            *m_out = nr;
            return refs;
        }
    }
    PyObject *left = PyList_GetSlice(pend, 0, PY_SSIZE_T_MAX);
    if (left == NULL)
        goto fail;
    while (PyList_GET_SIZE(left) && m < nr) {
        Py_ssize_t j, nl = PyList_GET_SIZE(left);
        for (j = 0; j < nl; j++) {
            PyObject *p = PyList_GET_ITEM(left, j);
            if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2 ||
                    !PyList_Check(PyTuple_GET_ITEM(p, 1))) {
                Py_DECREF(left);
                goto bad;
            }
            PyObject *wraws = PyTuple_GET_ITEM(p, 1);
            Py_ssize_t k = PyList_GET_SIZE(wraws);
            if (!k || m + k > nr)
                continue;
            PyObject *part = PyList_GetSlice(raws, m, m + k);
            int eq = part == NULL ? -1 : PyObject_RichCompareBool(wraws, part, Py_EQ);
            Py_XDECREF(part);
            if (eq < 0) {
                Py_DECREF(left);
                goto fail;
            }
            if (eq) {
                if (PyList_Append(refs, PyTuple_GET_ITEM(p, 0))
                        || PySequence_DelItem(left, j)) {
                    Py_DECREF(left);
                    goto fail;
                }
                m += k;
                break;
            }
        }
        if (j == nl)
            break;
    }
    Py_DECREF(left);
    *m_out = m;
    return refs;
bad:
    PyErr_SetString(PyExc_TypeError, "a pending write's shared items are (ref, [bytes])");
fail:
    Py_DECREF(refs);
    return NULL;
}

/* _stored_items(own): the items as stored and the entry's flags */
static PyObject *stored_items(ChanEnc *e, PyObject *own, long *flags)
{
    Py_ssize_t n = PyList_GET_SIZE(own), zc = 0;
    PyObject *items = PyList_New(n);
    if (items == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(own, i);
        int z = wants_zstd(b, e->min_bytes);
        if (z < 0)
            goto fail;
        if (z) {
            b = PyObject_CallOneArg(e->compress, b);
            if (b == NULL)
                goto fail;
            zc++;
        } else {
            Py_INCREF(b);
        }
        PyList_SET_ITEM(items, i, b);
    }
    *flags = zc && zc == n ? F_ZSTD : 0;
    return items;
fail:
    Py_DECREF(items);
    return NULL;
}

/* 1: some item is kept as itself (None) or as a copy (a dict or list), not serialized:
 * ChanState.as_is */
static int has_unserialized(PyObject *list)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *k = PyList_GET_ITEM(list, i);
        if (k == Py_None || PyDict_CheckExact(k) || PyList_CheckExact(k))
            return 1;
    }
    return 0;
}

/* _keep_items(c, v, prev, start, fresh); start -1: a FULL list; fresh: what the state keeps
 * of v[start:] (serialize_items) */
static int keep_items(PyObject *c, PyObject *v, PyObject *prev, Py_ssize_t start,
                      PyObject *fresh)
{
    PyObject *buf = NULL, *kept = NULL;
    int rc = -1;
    if (set(c, s_is_list, Py_True))
        return -1;
    if (start < 0) {
        buf = PyList_GetSlice(v, 0, PY_SSIZE_T_MAX);
        kept = buf == NULL ? NULL : PyList_GetSlice(fresh, 0, PY_SSIZE_T_MAX);
        if (kept == NULL || set(c, s_as_is, has_unserialized(kept) ? Py_True : Py_False))
            goto done;
    } else {
        buf = PyObject_GetAttr(prev, s_obj);
        kept = buf == NULL ? NULL : PyObject_GetAttr(prev, s_raw);
        if (kept == NULL)
            goto done;
        if (!PyList_Check(buf) || !PyList_Check(kept)) {
            PyErr_SetString(PyExc_TypeError, "a list channel's state holds lists");
            goto done;
        }
        if (PyList_GET_SIZE(buf) != start || PyList_GET_SIZE(kept) != start) {
            Py_SETREF(buf, PyList_GetSlice(buf, 0, start));
            if (buf == NULL)
                goto done;
            Py_SETREF(kept, PyList_GetSlice(kept, 0, start));
            if (kept == NULL)
                goto done;
        }
        PyObject *tail = PyList_GetSlice(v, start, PY_SSIZE_T_MAX);
        if (tail == NULL)
            goto done;
        int bad = PyList_SetSlice(buf, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, tail);   /* extend */
        Py_DECREF(tail);
        if (bad)
            goto done;
        if (PyList_SetSlice(kept, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, fresh))
            goto done;
        PyObject *prev_as_is = PyObject_GetAttr(prev, s_as_is);
        if (prev_as_is == NULL)
            goto done;
        int t = PyObject_IsTrue(prev_as_is);
        PyObject *as_is = t > 0 ? prev_as_is : (has_unserialized(fresh) ? Py_True : Py_False);
        int bad2 = t < 0 || set(c, s_as_is, as_is);
        Py_DECREF(prev_as_is);
        if (bad2)
            goto done;
    }
    if (set(c, s_obj, buf) || set(c, s_raw, kept))
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(v);
    if (set_new(c, s_n, PyLong_FromSsize_t(n)))
        goto done;
    if (n && (set(c, s_first, PyList_GET_ITEM(v, 0))
              || set(c, s_last, PyList_GET_ITEM(v, n - 1))
              || set(c, s_mid, PyList_GET_ITEM(v, n >> 1))))
        goto done;
    rc = 0;
done:
    Py_XDECREF(buf);
    Py_XDECREF(kept);
    return rc;
}

/* deltas + [ref]: a new list (prev.deltas is never mutated in place) */
static PyObject *plus(PyObject *deltas, PyObject *ref)
{
    if (ref == NULL)
        return NULL;
    PyObject *one = PyList_New(1);
    if (one == NULL) {
        Py_DECREF(ref);
        return NULL;
    }
    PyList_SET_ITEM(one, 0, ref);
    PyObject *out = PySequence_Concat(deltas, one);
    Py_DECREF(one);
    return out;
}

/* _append_deltas(c, prev, wrefs, items, flags, own, entries) */
static int append_deltas(ChanEnc *e, PyObject *c, PyObject *prev, PyObject *wrefs,
                         PyObject *items, long flags, PyObject *own, PyObject *entries,
                         unsigned long long lsn, Py_ssize_t idx)
{
    PyObject *deltas = NULL, *pl = NULL, *pi = NULL, *pref = NULL;
    int rc = -1;
    pref = PyObject_GetAttr(prev, s_ref);
    if (pref == NULL)
        goto done;
    if (!PyTuple_Check(pref) || PyTuple_GET_SIZE(pref) != 2) {
        PyErr_SetString(PyExc_TypeError, "a channel's ref is (lsn, idx)");
        goto done;
    }
    pl = PyTuple_GET_ITEM(pref, 0);
    pi = PyTuple_GET_ITEM(pref, 1);
    Py_INCREF(pl);
    Py_INCREF(pi);
    deltas = PyObject_GetAttr(prev, s_deltas);
    if (deltas == NULL)
        goto done;
    Py_ssize_t nw = PyList_GET_SIZE(wrefs), ni = PyList_GET_SIZE(items);
    if (nw) {
        Py_SETREF(deltas, plus(deltas, ref_bytes(lsn, (unsigned long long)idx)));
        if (deltas == NULL)
            goto done;
        PyObject *packed = PyList_New(nw);
        if (packed == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < nw; i++) {
            PyObject *b = ref_of(PyList_GET_ITEM(wrefs, i));
            if (b == NULL) {
                Py_DECREF(packed);
                goto done;
            }
            PyList_SET_ITEM(packed, i, b);
        }
        if (add_entry(entries, DELTA, packed, F_REFS, PyObject_Length(deltas), pl, pi))
            goto done;
        PyObject *r = Py_BuildValue("(Kn)", lsn, idx);
        if (r == NULL)
            goto done;
        Py_SETREF(pl, PyTuple_GET_ITEM(r, 0));
        Py_INCREF(pl);
        Py_SETREF(pi, PyTuple_GET_ITEM(r, 1));
        Py_INCREF(pi);
        if (set_new(c, s_ref, r))
            goto done;
        idx += 1;
    }
    if (ni || !nw) {
        Py_SETREF(deltas, plus(deltas, ref_bytes(lsn, (unsigned long long)idx)));
        if (deltas == NULL)
            goto done;
        PyObject *r = Py_BuildValue("(Kn)", lsn, idx);
        if (r == NULL)
            goto done;
        if (set(c, s_ref, r)) {
            Py_DECREF(r);
            goto done;
        }
        Py_INCREF(items);
        if (add_entry(entries, DELTA, items, flags, PyObject_Length(deltas), pl, pi)) {
            Py_DECREF(r);
            goto done;
        }
        if (ni && set_new(c, s_fresh, Py_BuildValue("(OO)", r, own))) {
            Py_DECREF(r);
            goto done;
        }
        Py_DECREF(r);
    }
    PyObject *every = PyObject_GetAttr(e->encoder, s_snapshot_every);
    if (every == NULL)
        goto done;
    PyObject *nd = PyLong_FromSsize_t(PyList_GET_SIZE(deltas));
    int snap = nd == NULL ? -1 : PyObject_RichCompareBool(nd, every, Py_GE);
    Py_XDECREF(nd);
    Py_DECREF(every);
    if (snap < 0)
        goto done;
    PyObject *base = PyObject_GetAttr(prev, s_base);
    if (base == NULL)
        goto done;
    if (snap) {
        Py_ssize_t sidx = PyList_GET_SIZE(entries);
        PyObject *one = PyList_New(1);
        if (one == NULL) {
            Py_DECREF(base);
            goto done;
        }
        PyList_SET_ITEM(one, 0, base);
        PyObject *all = PySequence_Concat(one, deltas);
        Py_DECREF(one);
        if (add_entry(entries, SNAP, all, 0, 0, NULL, NULL)
                || set_new(c, s_ref, Py_BuildValue("(Kn)", lsn, sidx))
                || set_new(c, s_base, ref_bytes(lsn, (unsigned long long)sidx)))
            goto done;
    } else {
        int bad = set(c, s_base, base) || set(c, s_deltas, deltas);
        Py_DECREF(base);
        if (bad)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(pref);
    Py_XDECREF(pl);
    Py_XDECREF(pi);
    Py_XDECREF(deltas);
    return rc;
}

/* _encode_list(c, v, prev or NULL, entries, pend) */
static int encode_list(ChanEnc *e, PyObject *c, PyObject *v, PyObject *prev,
                       PyObject *entries, PyObject *pend, unsigned long long lsn,
                       Py_ssize_t idx)
{
    Py_ssize_t start = -1;
    if (prev != NULL) {
        start = delta_start(e, prev, v);
        if (start == -2)
            return -1;
    }
    PyObject *fresh = NULL;
    PyObject *raws = serialize_items(e, v, start < 0 ? 0 : start, &fresh);
    if (raws == NULL)
        return -1;
    PyObject *wrefs = NULL, *own = NULL, *items = NULL;
    int rc = -1;
    Py_ssize_t m = 0;
    if (pend != Py_None && start >= 0 && PyObject_IsTrue(pend) == 1) {
        if (!PyList_Check(pend)) {
            PyErr_SetString(PyExc_TypeError, "pend is a list");
            goto done;
        }
        wrefs = match_writes(pend, raws, &m);
    } else {
        wrefs = PyList_New(0);
    }
    if (wrefs == NULL)
        goto done;
    own = m ? PyList_GetSlice(raws, m, PY_SSIZE_T_MAX) : (Py_INCREF(raws), raws);
    if (own == NULL)
        goto done;
    long flags = 0;
    items = stored_items(e, own, &flags);
    if (items == NULL || keep_items(c, v, prev, start, fresh))
        goto done;
    if (start < 0) {
        Py_INCREF(items);
        if (add_entry(entries, FULL, items, flags, 0, NULL, NULL)
                || set_new(c, s_base, ref_bytes(lsn, (unsigned long long)idx)))
            goto done;
    } else if (append_deltas(e, c, prev, wrefs, items, flags, own, entries, lsn, idx)) {
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(items);
    Py_XDECREF(own);
    Py_XDECREF(wrefs);
    Py_DECREF(raws);
    Py_DECREF(fresh);
    return rc;
}

static PyObject *chanenc_call(PyObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    ChanEnc *e = (ChanEnc *)self;
    if (PyVectorcall_NARGS(nargsf) != 6 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "enc(ch, v, prev, lsn, entries, pend)");
        return NULL;
    }
    PyObject *ch = args[0], *v = args[1], *prev = args[2], *lsno = args[3];
    PyObject *entries = args[4], *pend = args[5];
    if (!PyList_CheckExact(entries))
        Py_RETURN_NONE;
    int is_list = PyList_Check(v);
    if (is_list && !PyList_CheckExact(v))
        Py_RETURN_NONE;     /* a list subclass: the Python path */
    PyObject *prev_list = NULL;     /* prev, when it is a list's state */
    if (prev != Py_None) {
        PyObject *loaded = PyObject_GetAttr(prev, s_loaded);
        if (loaded == NULL)
            return NULL;
        int t = PyObject_IsTrue(loaded);
        Py_DECREF(loaded);
        if (t < 0)
            return NULL;
        if (!t)
            Py_RETURN_NONE;     /* known by its ref only: Python loads it from the log */
        if (is_list) {
            PyObject *pl = PyObject_GetAttr(prev, s_is_list);
            if (pl == NULL)
                return NULL;
            t = PyObject_IsTrue(pl);
            Py_DECREF(pl);
            if (t < 0)
                return NULL;
            if (t)
                prev_list = prev;
        }
    }
    if (is_list) {
        PyObject *pc = PyObject_GetAttr(e->encoder, s_prefix_check);
        if (pc == NULL)
            return NULL;
        int t = PyObject_IsTrue(pc);
        Py_DECREF(pc);
        if (t <= 0) {
            if (t < 0)
                return NULL;
            Py_RETURN_NONE;     /* delta_check="identity": the Python path */
        }
    }
    unsigned long long lsn = PyLong_AsUnsignedLongLong(lsno);
    if (lsn == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t idx = PyList_GET_SIZE(entries);
    PyObject *ref = Py_BuildValue("(On)", lsno, idx);
    if (ref == NULL)
        return NULL;
    /* ChanState(ref): its __init__'s two fields set here, without its Python frame */
    PyObject *c = PyBaseObject_Type.tp_new((PyTypeObject *)e->chan_state, empty_args, NULL);
    if (c == NULL || set(c, s_ref, ref) || set(c, s_loaded, Py_True)) {
        Py_XDECREF(c);
        Py_DECREF(ref);
        return NULL;
    }
    Py_DECREF(ref);
    PyObject *out = NULL;
    int wrap = 1;
    if (is_list) {
        if (encode_list(e, c, v, prev_list, entries, pend, lsn, idx) == 0) {
            Py_INCREF(c);
            out = c;
        }
    } else {
        out = encode_value(e, v, c, lsn, idx, entries, &wrap);
    }
    Py_DECREF(c);
    if (out == NULL && wrap && PyErr_ExceptionMatches(PyExc_Exception)) {
        /* the SerializationError the Python path raises, its cause the error */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        PyObject *err = PyObject_CallFunctionObjArgs(e->wrap, ch, exc, NULL);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        if (err != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(err), err);
            Py_DECREF(err);
        }
    }
    return out;
}

/* enc.channels(values, versions, all_values, base, base_versions, linear, pend, lsn,
 *              entries, encode_py) -> (chans, refs, fresh) | None
 *
 * kernel/store/writer.py's Writer._encode_channels loops, after their base is chosen: each
 * channel of ``values`` encoded (this type's call, else ``encode_py``), then each channel
 * only in ``versions`` kept from the base or stored from ``all_values``. The dicts must be
 * exact dicts (else None, nothing done); a dict whose size changes while it is walked (a
 * serializer that edits it) raises the RuntimeError Python's iteration raises. */
static PyObject *encode_one(ChanEnc *e, PyObject *ch, PyObject *v, PyObject *prev,
                            PyObject *lsn, PyObject *entries, PyObject *pend,
                            PyObject *encode_py)
{
    PyObject *a[6] = {ch, v, prev, lsn, entries, pend};
    PyObject *c = chanenc_call((PyObject *)e, a, 6, NULL);
    if (c != Py_None)
        return c;
    Py_DECREF(c);
    return PyObject_Vectorcall(encode_py, a, 6, NULL);
}

static int changed(PyObject *d, Py_ssize_t size)
{
    if (PyDict_GET_SIZE(d) == size)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
    return 1;
}

static PyObject *chanenc_channels(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    ChanEnc *e = (ChanEnc *)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "channels() takes 10 arguments");
        return NULL;
    }
    PyObject *values = args[0], *versions = args[1], *all_values = args[2], *base = args[3];
    PyObject *base_versions = args[4], *pend = args[6], *lsn = args[7], *entries = args[8];
    PyObject *encode_py = args[9];
    if (!PyDict_CheckExact(values) || !PyDict_CheckExact(versions) || !PyDict_CheckExact(base)
            || !PyDict_CheckExact(base_versions) || !PyList_CheckExact(entries)
            || (all_values != Py_None && !PyDict_CheckExact(all_values))
            || (pend != Py_None && !PyDict_CheckExact(pend)))
        Py_RETURN_NONE;
    int linear = PyObject_IsTrue(args[5]);
    if (linear < 0)
        return NULL;
    PyObject *chans = PyDict_New(), *refs = PyDict_New(), *fresh = NULL, *out = NULL;
    PyObject *k = NULL, *v = NULL, *c = NULL, *ref = NULL;
    if (chans == NULL || refs == NULL)
        goto done;
    Py_ssize_t pos = 0, size = PyDict_GET_SIZE(values);
    PyObject *bk, *bv;
    while (!changed(values, size) && PyDict_Next(values, &pos, &bk, &bv)) {
        k = bk, v = bv;
        Py_INCREF(k);
        Py_INCREF(v);
        PyObject *prev = linear ? PyDict_GetItemWithError(base, k) : Py_None;
        if (prev == NULL && PyErr_Occurred())
            goto done;
        PyObject *p = Py_None;
        if (pend != Py_None && PyDict_GET_SIZE(pend)) {
            p = PyDict_GetItemWithError(pend, k);
            if (p == NULL && PyErr_Occurred())
                goto done;
        }
        prev = prev == NULL ? Py_None : prev;
        p = p == NULL ? Py_None : p;
        Py_INCREF(prev);
        Py_INCREF(p);
        c = encode_one(e, k, v, prev, lsn, entries, p, encode_py);
        Py_DECREF(prev);
        Py_DECREF(p);
        if (c == NULL || PyDict_SetItem(chans, k, c))
            goto done;
        ref = PyObject_GetAttr(c, s_ref);
        if (ref == NULL || PyDict_SetItem(refs, k, ref))
            goto done;
        Py_CLEAR(ref);
        PyObject *f = PyObject_GetAttr(c, s_fresh);
        if (f == NULL)
            goto done;
        if (f != Py_None) {
            if (fresh == NULL && (fresh = PyDict_New()) == NULL) {
                Py_DECREF(f);
                goto done;
            }
            int bad = PyDict_SetItem(fresh, k, f) || set(c, s_fresh, Py_None);
            Py_DECREF(f);
            if (bad)
                goto done;
        } else {
            Py_DECREF(f);
        }
        Py_CLEAR(c);
        Py_CLEAR(k);
        Py_CLEAR(v);
    }
    if (PyErr_Occurred())
        goto done;
    pos = 0;
    size = PyDict_GET_SIZE(versions);
    while (!changed(versions, size) && PyDict_Next(versions, &pos, &bk, &bv)) {
        k = bk, v = bv;             /* v: the version */
        Py_INCREF(k);
        Py_INCREF(v);
        int has = PyDict_Contains(chans, k);
        if (has < 0)
            goto done;
        if (!has) {
            PyObject *bc = PyDict_GetItemWithError(base, k);
            if (bc == NULL && PyErr_Occurred())
                goto done;
            int keep = 0;
            if (bc != NULL) {
                if (all_values == Py_None) {
                    keep = 1;
                } else {
                    /* base_versions.get(ch, c) == versions[ch]: ==, never identity */
                    PyObject *was = PyDict_GetItemWithError(base_versions, k);
                    if (was == NULL && PyErr_Occurred())
                        goto done;
                    Py_INCREF(bc);
                    PyObject *eq = PyObject_RichCompare(was == NULL ? bc : was, v, Py_EQ);
                    Py_DECREF(bc);
                    keep = eq == NULL ? -1 : PyObject_IsTrue(eq);
                    Py_XDECREF(eq);
                    if (keep < 0)
                        goto done;
                }
            }
            if (keep) {
                ref = PyObject_GetAttr(bc, s_ref);
                if (ref == NULL || PyDict_SetItem(chans, k, bc) || PyDict_SetItem(refs, k, ref))
                    goto done;
                Py_CLEAR(ref);
            } else if (all_values != Py_None) {
                PyObject *av = PyDict_GetItemWithError(all_values, k);
                if (av == NULL && PyErr_Occurred())
                    goto done;
                if (av != NULL) {
                    PyObject *prev = linear && bc != NULL ? bc : Py_None;
                    Py_INCREF(av);
                    Py_INCREF(prev);
                    c = encode_one(e, k, av, prev, lsn, entries, Py_None, encode_py);
                    Py_DECREF(av);
                    Py_DECREF(prev);
                    if (c == NULL || PyDict_SetItem(chans, k, c))
                        goto done;
                    ref = PyObject_GetAttr(c, s_ref);
                    if (ref == NULL || PyDict_SetItem(refs, k, ref))
                        goto done;
                    Py_CLEAR(ref);
                    Py_CLEAR(c);
                }
            }
        }
        Py_CLEAR(k);
        Py_CLEAR(v);
    }
    if (PyErr_Occurred())
        goto done;
    out = PyTuple_Pack(3, chans, refs, fresh == NULL ? Py_None : fresh);
done:
    Py_XDECREF(k);
    Py_XDECREF(v);
    Py_XDECREF(c);
    Py_XDECREF(ref);
    Py_XDECREF(chans);
    Py_XDECREF(refs);
    Py_XDECREF(fresh);
    return out;
}

static PyMethodDef chanenc_methods[] = {
    {"channels", (PyCFunction)(void (*)(void))chanenc_channels, METH_FASTCALL,
     "channels(values, versions, all_values, base, base_versions, linear, pend, lsn, "
     "entries, encode_py) -> (chans, refs, fresh) or None: Writer._encode_channels' loops."},
    {NULL, NULL, 0, NULL},
};

static PyObject *chanenc_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *encoder, *dumps, *compress, *chan_state, *has_prefix, *wrap;
    Py_ssize_t min_bytes;
    PyObject *serde;
    (void)kw;
    if (!PyArg_ParseTuple(args, "OOOnO!OOO", &encoder, &dumps, &compress, &min_bytes,
                          &PyType_Type, &chan_state, &has_prefix, &wrap, &serde))
        return NULL;
    ChanEnc *e = (ChanEnc *)type->tp_alloc(type, 0);
    if (e == NULL)
        return NULL;
    e->vectorcall = chanenc_call;
    Py_INCREF(encoder); e->encoder = encoder;
    Py_INCREF(dumps); e->dumps = dumps;
    Py_INCREF(compress); e->compress = compress;
    Py_INCREF(chan_state); e->chan_state = chan_state;
    Py_INCREF(has_prefix); e->has_prefix = has_prefix;
    Py_INCREF(wrap); e->wrap = wrap;
    e->min_bytes = min_bytes;
    Py_INCREF(serde); e->serde = serde;
    return (PyObject *)e;
}

static int chanenc_traverse(ChanEnc *e, visitproc visit, void *arg)
{
    Py_VISIT(e->encoder);
    Py_VISIT(e->dumps);
    Py_VISIT(e->compress);
    Py_VISIT(e->chan_state);
    Py_VISIT(e->has_prefix);
    Py_VISIT(e->wrap);
    Py_VISIT(e->serde);
    return 0;
}

static int chanenc_clear(ChanEnc *e)
{
    Py_CLEAR(e->encoder);
    Py_CLEAR(e->dumps);
    Py_CLEAR(e->compress);
    Py_CLEAR(e->chan_state);
    Py_CLEAR(e->has_prefix);
    Py_CLEAR(e->wrap);
    Py_CLEAR(e->serde);
    return 0;
}

static void chanenc_dealloc(ChanEnc *e)
{
    PyObject_GC_UnTrack(e);
    chanenc_clear(e);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyTypeObject ChanEncType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "durkv._chanenc.ChanEncoder",
    .tp_basicsize = sizeof(ChanEnc),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "ChanEncoder(encoder, dumps, compress, min_bytes, chan_state, has_prefix, wrap):"
              " ChannelEncoder.encode in C for its common cases (kernel/store/delta.py).",
    .tp_new = chanenc_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ChanEnc, vectorcall),
    .tp_traverse = (traverseproc)chanenc_traverse,
    .tp_clear = (inquiry)chanenc_clear,
    .tp_dealloc = (destructor)chanenc_dealloc,
    .tp_methods = chanenc_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "durkv._chanenc",
    "A put's channel encoded in one C call.", -1, NULL, NULL, NULL, NULL, NULL,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__chanenc(void)
{
    INTERN(s_loaded, "loaded");
    INTERN(s_is_list, "is_list");
    INTERN(s_obj, "obj");
    INTERN(s_raw, "raw");
    INTERN(s_as_is, "as_is");
    INTERN(s_n, "n");
    INTERN(s_first, "first");
    INTERN(s_last, "last");
    INTERN(s_mid, "mid");
    INTERN(s_vbytes, "vbytes");
    INTERN(s_base, "base");
    INTERN(s_deltas, "deltas");
    INTERN(s_fresh, "fresh");
    INTERN(s_ref, "ref");
    INTERN(s_snapshot_every, "snapshot_every");
    INTERN(s_prefix_check, "_prefix_check");
    INTERN(s_plain_tag, "plain_tag");
    INTERN(s_rewritten, "rewritten");
    if ((empty_args = PyTuple_New(0)) == NULL)
        return NULL;
    if (PyType_Ready(&ChanEncType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ChanEncType);
    if (PyModule_AddObject(m, "ChanEncoder", (PyObject *)&ChanEncType) < 0) {
        Py_DECREF(&ChanEncType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
