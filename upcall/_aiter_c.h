/* The C-API glue of the asyncio awaitables (upcall/_aiter.pxi), kept apart
 * from the Cython code because it reaches into CPython's type slots and the
 * collector's tracking:
 *
 *  - the am_send slot of _Next (PyIter_Send, what `await` calls on 3.10+:
 *    the message is returned without making a StopIteration);
 *  - untracking the containers of a decoded message while it waits in the
 *    hand-over queue, and tracking them again when it is handed out.
 *
 * Public C-API only (PySendResult, tp_as_async->am_send and
 * PyObject_GC_IsTracked are 3.10+ public API; tests/project/test_private_api.py
 * reads this file).  With the GIL, on the event loop's thread or a delivery
 * thread holding it. */
#ifndef UPCALL_AITER_C_H
#define UPCALL_AITER_C_H
#include <Python.h>

/* ---- am_send ------------------------------------------------------------ */

typedef PyObject *(*uc_next_step_fn)(PyObject *self, PyObject *arg, int *done);
static uc_next_step_fn uc_next_step;

static void uc_next_set_step(uc_next_step_fn f) { uc_next_step = f; }

/* am_send: PYGEN_RETURN with the message, PYGEN_NEXT with what the
 * waiting coroutine yields, PYGEN_ERROR with an exception set. */
static PySendResult uc_next_send(PyObject *self, PyObject *arg, PyObject **result) {
    int done = 0;
    PyObject *r = uc_next_step(self, arg, &done);
    *result = r;
    if (r == NULL) return PYGEN_ERROR;
    return done ? PYGEN_RETURN : PYGEN_NEXT;
}

static int uc_next_install_send(PyTypeObject *t) {
    if (t->tp_as_async == NULL) return -1;
    t->tp_as_async->am_send = uc_next_send;
    return 0;
}

/* NULL: the exception PyIter_Send set goes on (Cython raises it). */
static PyObject *uc_pass_error(void) { return NULL; }

/* ---- the collector's tracking ------------------------------------------- */

/* Untrack (track = 0) or track again o's containers, children first;
 * only exact dicts, lists and tuples, down to depth 32.  Tracking again
 * follows CPython's own rule for dicts: a dict only if it holds
 * something the collector may have to see, so a dict of atoms stays
 * untracked as the decoder made it.  The children are visited with the
 * type's own tp_traverse, as the collector visits them (PyDict_Next
 * cost about 50 instructions an entry); atoms are passed over without
 * a call (their type has no Py_TPFLAGS_HAVE_GC). */
typedef struct { int track, depth, need; } uc_tracking;

static void uc_set_tracking(PyObject *o, int track, int depth);

static int uc_tracking_visit(PyObject *v, void *arg) {
    uc_tracking *t = (uc_tracking *)arg;
    if (!PyType_HasFeature(Py_TYPE(v), Py_TPFLAGS_HAVE_GC)) return 0;
    uc_set_tracking(v, t->track, t->depth + 1);
    if (!t->need) t->need = !PyTuple_CheckExact(v) || PyObject_GC_IsTracked(v);
    return 0;
}

static void uc_set_tracking(PyObject *o, int track, int depth) {
    PyTypeObject *tp = Py_TYPE(o);
    uc_tracking t;
    if (tp != &PyDict_Type && tp != &PyList_Type && tp != &PyTuple_Type)
        return;     /* atoms, and objects of other types: left as they are */
    t.track = track;
    t.depth = depth;
    t.need = depth >= 32;
    if (!t.need) tp->tp_traverse(o, uc_tracking_visit, &t);
    if (track) {
        /* A list or a tuple is tracked whatever it holds, as CPython makes them. */
        if ((t.need || tp != &PyDict_Type) && !PyObject_GC_IsTracked(o))
            PyObject_GC_Track(o);
    } else if (PyObject_GC_IsTracked(o)) {
        PyObject_GC_UnTrack(o);
    }
}

#endif
