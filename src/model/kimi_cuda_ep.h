/* model/kimi_cuda_ep.h: the routed experts of the CUDA target spread over the devices of one
 * host (expert parallelism, `--devices cuda:0,cuda:1,...`; docs/cuda.md "Several GPUs").
 * Internal to model/: kimi_cuda.c opens it and calls it from each MoE layer. */
#ifndef EM_KIMI_CUDA_EP_H
#define EM_KIMI_CUDA_EP_H

#include "backend/gpu.h"
#include "model/weights.h"

/* One MoE layer's stacks as the file holds them (host views) and how they run. */
typedef struct gk_ep_layer {
    const em_mat *gate, *up, *down;
} gk_ep_layer;

typedef struct gk_ep_spec {
    const int *devices;          /* CUDA indices; devices[0] is the target's own (gpu0) */
    int n_devices;               /* 1..EM_GPU_MAX_SHARES */
    em_gpu *gpu0;
    uint64_t gpu0_reserved;      /* bytes gpu0 needs for everything but its experts */
    const gk_ep_layer *layers;   /* [n_layers] */
    int n_layers;
    int n_expert, k, ffn;
    int64_t cols;                /* the experts' input width (the model's, or K3's latent) */
    int act;                     /* EM_GPU_ACT_* */
    float situ_beta, situ_lin_beta;
    const char *path;            /* for messages */
} gk_ep_spec;

typedef struct gk_ep gk_ep;

/* The experts' ranges: device r (of n, 1..EM_GPU_MAX_SHARES) gets experts first[r] ..
 * first[r + 1] - 1 of n_expert, in proportion to cap[r] (the experts its memory takes), at
 * least one and at most cap[r] each. Needs every cap[r] >= 1, their sum >= n_expert >= n. */
void gk_ep_split(const int64_t *cap, int n, int n_expert, int *first);

/* Opens the other devices, chooses each device's contiguous range of experts from its free
 * memory (the same ranges in every layer), uploads each device's share of every layer and
 * makes its buffers; logs the placement. A model whose experts do not fit the devices
 * together is refused with the bytes it needs and the bytes each device has free. */
int gk_ep_open(gk_ep **out, const gk_ep_spec *spec, em_err *err);
void gk_ep_close(gk_ep *ep); /* NULL-safe */

/* The routed experts of MoE layer `layer` over the n rows of x (ldx == cols; x_act: their
 * Q8_0 activations on gpu0, or NULL) routed by ids / wts ([n][k] on gpu0): y (ldy) on gpu0,
 * bit-identical to em_gpu_moe_prepared over the whole stacks. Queued on each device's stream,
 * no host sync. */
int gk_ep_moe(gk_ep *ep, int layer, const float *x, int64_t ldx, int n, const em_gpu_act *x_act, const int32_t *ids,
              const float *wts, float *y, int64_t ldy, em_err *err);

#endif
