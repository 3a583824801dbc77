#ifndef LLB_BINDINGS_H
#define LLB_BINDINGS_H
#include <Python.h>
extern PyMethodDef llb_core_methods[];
extern PyMethodDef llb_matmul_methods[];
extern PyMethodDef llb_ops_methods[];
extern PyMethodDef llb_encoder_methods[];
#endif
