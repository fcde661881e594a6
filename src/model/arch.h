/* Internal to model/: the architectures target.c dispatches to. Each constructor takes the
 * opened GGUF (ownership passes to it: it is closed on failure too) and the options with every
 * field already resolved (no zeros left), and returns a target with ops, info set. */
#ifndef EM_MODEL_ARCH_H
#define EM_MODEL_ARCH_H

#include "format/gguf.h"
#include "model/model.h"

/* kimi-linear and kimi-k3 (the variant is read from the file) */
int em_kimi_linear_open(em_target **out, em_gguf *g, const em_model_opts *opts, em_err *err);
/* The same models on CUDA device `index` (model/kimi_cuda.c): EM_EUNSUPPORTED without CUDA
 * or a usable device, EM_ENOMEM naming both sizes when the model does not fit. */
int em_kimi_cuda_open(em_target **out, em_gguf *g, const em_model_opts *opts, int index, em_err *err);

#endif
