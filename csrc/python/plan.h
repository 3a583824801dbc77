/* Op plans: record a sequence of validated op calls once, replay it from C.
 *
 * Every op binding parses and validates its Python arguments into a small
 * args struct, then hands llb_call() that struct, the function that runs it,
 * and the buffer views it acquired. llb_call runs the op with the GIL
 * released. If the calling thread is recording a Plan (_native.Plan().begin()),
 * the plan also keeps a copy of the args and takes over the views: they pin
 * the arrays, so the pointers inside the args stay valid for the plan's life.
 * Plan.replay() then runs every kept call in order with the GIL released once,
 * touching no Python object.
 *
 * What an op reads from buffer *contents* (token ids, slots, positions) can
 * change between replays; such a call has a `check` that re-validates it, and
 * replay runs every check before the first call (a failed check raises the
 * binding's own ValueError and nothing is written), and again just before the
 * call itself (in case an earlier call of the plan wrote those buffers). */
#ifndef LLB_PLAN_H
#define LLB_PLAN_H
#include <Python.h>
#include <stddef.h>

/* Largest args struct a call may carry (moe's is the biggest). */
#define LLB_CALL_MAX_ARGS 320
/* Put after each args struct: a struct that outgrows a record fails the build. */
#define LLB_CALL_ARGS_FIT(T) _Static_assert(sizeof(T) <= LLB_CALL_MAX_ARGS, #T " outgrew LLB_CALL_MAX_ARGS")
/* Room for one ValueError message written by a check. */
#define LLB_CHECK_MSG 200

struct llb_call {
    const char *op;                              /* the binding's name */
    int (*run)(const void *args);                /* 0, or -1 when out of memory; runs without the GIL */
    int (*check)(const void *args, char *msg);   /* NULL, or 0 / -1 with a message of < LLB_CHECK_MSG bytes;
                                                    runs without the GIL, so it may only read args and buffers */
    const void *args;
    size_t size;                                 /* sizeof *args, <= LLB_CALL_MAX_ARGS */
};

/* Check and run c, and record it if this thread records a plan. views[0..n)
 * are the caller's acquired buffers: on return each one is either released or
 * owned by the plan, with its obj set to NULL (so releasing it again is a
 * no-op). Returns a new reference to None, or NULL with an exception set. */
PyObject *llb_call(const struct llb_call *c, Py_buffer *const *views, int n);

/* Nonzero while this thread records a plan (ops a plan cannot hold refuse to run). */
int llb_plan_recording(void);

/* Adds the Plan type to the module; 0 or -1 with an exception set. */
int llb_plan_add_type(PyObject *module);

#endif
