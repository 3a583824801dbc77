/* The CPython extension llambda._native: only glue. Each binding file
 * (py_*.c) exports a NULL-terminated PyMethodDef table; this file concatenates
 * them into the module's method table. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "core/state.h"
#include "python/bindings.h"
#include "python/plan.h"

static PyMethodDef *const tables[] = {
    llb_core_methods,    /* py_core.c: isa selection, thread pool, counters */
    llb_matmul_methods,  /* py_matmul.c: quantized matmul, repack, activation quantization */
    llb_ops_methods,     /* py_ops.c: rmsnorm, rope, attention, activations, kv cache */
    llb_encoder_methods, /* py_encoder.c: dense products, layernorm, attention of packed sequences */
};

static PyMethodDef all_methods[256];

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_native", "llambda's C core: SIMD kernels and a thread pool.", -1, all_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    size_t k = 0;
    for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
        for (PyMethodDef *m = tables[t]; m->ml_name; m++) {
            if (k + 1 >= sizeof(all_methods) / sizeof(all_methods[0])) {
                PyErr_SetString(PyExc_RuntimeError, "too many native methods");
                return NULL;
            }
            all_methods[k++] = *m;
        }
    all_methods[k] = (PyMethodDef){NULL, NULL, 0, NULL};
    if (llb_core_init() != 0) {
        PyErr_SetString(PyExc_RuntimeError, "llambda native core failed to initialise");
        return NULL;
    }
    PyObject *m = PyModule_Create(&moddef);
    if (m && llb_plan_add_type(m) != 0) Py_CLEAR(m); /* plan.c: _native.Plan, recorded op lists */
    return m;
}
