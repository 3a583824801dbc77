/* Argument parsing shared by every binding (py_core.c, py_matmul.c, py_ops.c).
 *
 * Arguments are positional (METH_FASTCALL). Integers come through __index__ and
 * must lie in a stated range; floats must be finite. Buffers come through the
 * buffer protocol and must be C-contiguous, writable when written, of the
 * element type asked for (or raw bytes 'B'/'b'/'c', for views of an arena),
 * aligned to their element size, and hold at least (or exactly) the elements the
 * dims given need. The views a binding acquires are kept in a struct llb_bufs
 * and handed to llb_call (plan.h) by llb_bufs_call, or released on error.
 *
 * A buffer of the wrong kind (not a buffer, not contiguous, read-only, wrong
 * element type) raises bufs->error: TypeError for the matmul bindings and
 * ValueError for the op bindings, as each has always done (tests and callers
 * rely on it); sizes, ranges and alignment always raise ValueError. */
#ifndef LLB_ARGS_H
#define LLB_ARGS_H
#include <Python.h>
#include <stddef.h>

#include "python/plan.h"

/* Largest value of any dim or count: every product of dims is checked for overflow,
 * and no index of a single dim overflows a 32-bit int (token ids and positions are int32). */
#define LLB_ARG_MAX_DIM 0x7FFFFFFFL
/* Most buffers one binding holds (moe: x, logits, out, 2 scratch, 3 expert tensors and their biases,
 * shared, its logit). */
#define LLB_ARG_MAX_BUFS 16

enum llb_elem { LLB_ELEM_BYTES, LLB_ELEM_F32, LLB_ELEM_I32, LLB_ELEM_F16 };

struct llb_bufs {
    PyObject *error; /* exception class for a buffer of the wrong kind (see above) */
    Py_buffer views[LLB_ARG_MAX_BUFS];
    int count;
};

/* TypeError unless nargs == want; sig names the arguments ("x, w, out"). */
int llb_arg_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t want, const char *sig);
/* An int in [lo, hi] (TypeError if not an int, ValueError if out of range). */
int llb_arg_long(PyObject *o, const char *fn, const char *name, long lo, long hi, long *out);
/* A finite float32 value >= lo (lo = -INFINITY: any finite value). */
int llb_arg_float(PyObject *o, const char *fn, const char *name, double lo, float *out);
/* *out = a * b * c * d, or ValueError when that overflows size_t. */
int llb_arg_product(const char *fn, size_t *out, size_t a, size_t b, size_t c, size_t d);

/* Acquire obj into bufs as a buffer of at least count elements of kind (exactly count if
 * exact; bytes for LLB_ELEM_BYTES, which takes any format). Returns its data pointer, or
 * NULL with an exception set (the view, if acquired, stays in bufs for llb_bufs_release). */
void *llb_arg_buf(struct llb_bufs *bufs, PyObject *obj, const char *fn, const char *name, int writable,
                  enum llb_elem kind, size_t count, int exact);
/* Nonzero if the i-th and j-th acquired buffers share a byte. */
int llb_bufs_overlap(const struct llb_bufs *bufs, int i, int j);
/* Nonzero if one of the buffers `written` (indices) shares a byte with any other acquired buffer (an op
 * writing state indexed by its other arguments must not move those under it); *w and *o name the pair. */
int llb_bufs_written_overlap(const struct llb_bufs *bufs, const int *written, int n_written, int *w, int *o);
void llb_bufs_release(struct llb_bufs *bufs);
/* llb_call (plan.h) with every acquired view: runs (and maybe records) the validated call. */
PyObject *llb_bufs_call(struct llb_bufs *bufs, const char *fn, int (*run)(const void *),
                        int (*check)(const void *, char *), const void *args, size_t size);

/* llb_bufs_call, once out (the last buffer acquired) shares no byte with an input (same_ok: it may be
 * an input exactly, same start and length, for ops that read a row whole before they write it);
 * releases bufs on error. */
PyObject *llb_bufs_call_out_apart(struct llb_bufs *bufs, const char *op, int same_ok, int (*run)(const void *),
                                  int (*check)(const void *, char *), const void *args, size_t size);

#endif
