/* backend/cuda/cuda_impl.cuh: what the backend's .cu files share: the context struct, the
 * CUDA error helpers, and small device helpers. Internal to backend/cuda/. */
#ifndef EM_CUDA_IMPL_CUH
#define EM_CUDA_IMPL_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <stdint.h>

extern "C" {
#include "backend/gpu.h"
#include "quant/quant.h"
}

#define EMC_BRANCHES 4 /* side streams for concurrent branches (em_gpu_fork) */

struct em_gpu {
    int index;
    cudaStream_t stream;  /* where ops go now: main, or a side stream between fork and join */
    cudaStream_t main;
    cudaStream_t side[EMC_BRANCHES];
    cudaEvent_t fork_ev, join_ev[EMC_BRANCHES];
    int n_branches;       /* side streams forked and not yet joined */
    cudaEvent_t ev[2];
    em_gpu_info info;
};

struct em_gpu_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

/* EM_EIO naming the CUDA call (what) and CUDA's error name and text; clears a non-sticky error. */
int emc_fail(em_err *err, cudaError_t e, const char *what);
/* Makes g's device current for this thread (contexts of several devices may share a thread). */
int emc_use(em_gpu *g, em_err *err);
/* The launch status of the last kernel (a bad configuration shows here, not at the sync). */
int emc_launched(em_err *err, const char *kernel);

#define EMC_TRY(call, what)                             \
    do {                                                \
        cudaError_t e_ = (call);                        \
        if (e_ != cudaSuccess) return emc_fail(err, e_, what); \
    } while (0)

/* Argument checks shared by the ops: EM_EINVAL naming the op and the argument. */
#define EMC_CHECK(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) return em_err_set(err, EM_EINVAL, __VA_ARGS__);        \
    } while (0)

static inline unsigned emc_blocks(int64_t work, int per_block) {
    return (unsigned)((work + per_block - 1) / per_block);
}

#endif
