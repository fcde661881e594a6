/* model/kimi_cuda_ep.c: the routed experts of the CUDA target spread over the devices of one
 * host (kimi_cuda_ep.h; docs/cuda.md "Several GPUs").
 *
 * Invariants:
 * - Device r holds experts first[r] .. first[r + 1] - 1 of every MoE layer (contiguous, so
 *   ascending expert order is ascending device order), at least one; device 0 is the target's.
 * - A MoE layer: device 0 broadcasts its rows and routes, every device runs its share
 *   (em_gpu_moe_share), the others' slot outputs are gathered to device 0, which combines them
 *   (em_gpu_moe_combine): the arithmetic of every value is the one-device path's, so logits
 *   and greedy tokens do not depend on the number of devices.
 * - Everything is queued on the devices' streams in the order the layers run; the exchanges
 *   order the devices among themselves (ep.cu), nothing waits on the host. */
#include "model/kimi_cuda_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EP_ROWS EM_GPU_MAX_ROWS
#define EP_MARGIN_BYTES (512ull << 20) /* a device's CUDA context, launches (kimi_cuda.c's margin) */

typedef struct ep_share {     /* one layer's experts on one device */
    em_gpu_mat gate, up, down;
} ep_share;

typedef struct ep_dev {
    em_gpu *gpu;
    bool owned;               /* opened here (device 0 is the target's) */
    ep_share *share;          /* [n_layers] */
    float *x, *slots;         /* r >= 1: the rows received; r: its slot outputs */
    int32_t *ids;             /* r >= 1: the routes received */
    void *scratch;
    float *recv;              /* device 0: [n][EP_ROWS k][cols] slot outputs of every device */
    uint64_t expert_bytes;
} ep_dev;

struct gk_ep {
    gk_ep_spec s;
    int n;
    int first[EM_GPU_MAX_SHARES + 1];
    ep_dev d[EM_GPU_MAX_SHARES];
    em_gpu_ep *comm;
};

static uint64_t slot_bytes(const gk_ep *ep) { return (uint64_t)EP_ROWS * (uint64_t)ep->s.k * (uint64_t)ep->s.cols * 4; }

/* Device bytes of one expert of every layer (gate, up and down in the device layouts). */
static int bytes_per_expert(const gk_ep_spec *s, uint64_t *out, em_err *err) {
    *out = 0;
    for (int l = 0; l < s->n_layers; l++) {
        const gk_ep_layer *y = &s->layers[l];
        uint64_t g, u, d;
        int rc = em_gpu_mat_bytes(y->gate->type, s->ffn, y->gate->cols, &g, err);
        if (!rc) rc = em_gpu_mat_bytes(y->up->type, s->ffn, y->up->cols, &u, err);
        if (!rc) rc = em_gpu_mat_bytes(y->down->type, y->down->rows / s->n_expert, s->ffn, &d, err);
        if (rc) return rc;
        *out += g + u + d;
    }
    return EM_OK;
}

/* Buffers a device needs beside its experts (device 0: the received slots of all). */
static uint64_t buffer_bytes(const gk_ep *ep, int r, int n_expert_here) {
    const uint64_t rows = (uint64_t)EP_ROWS * (uint64_t)ep->s.cols * 4, ids = (uint64_t)EP_ROWS * (uint64_t)ep->s.k * 4;
    const uint64_t scratch = em_gpu_moe_scratch_bytes(n_expert_here, ep->s.k, ep->s.ffn, ep->s.cols, EP_ROWS);
    return scratch + (r == 0 ? (uint64_t)ep->n * slot_bytes(ep) : slot_bytes(ep) + rows + ids) + 4 * 256;
}

/* Each device's range: in proportion to the experts its free memory takes, every device at
 * least one; refused when they do not fit together. */
static int place(gk_ep *ep, uint64_t per_expert, em_err *err) {
    const int X = ep->s.n_expert;
    int64_t cap[EM_GPU_MAX_SHARES], total = 0;
    uint64_t free_b[EM_GPU_MAX_SHARES];
    for (int r = 0; r < ep->n; r++) {
        uint64_t fr = 0, tot = 0;
        int rc = em_gpu_mem(ep->d[r].gpu, &fr, &tot, err);
        if (rc) return rc;
        const uint64_t keep = EP_MARGIN_BYTES + buffer_bytes(ep, r, X) + (r == 0 ? ep->s.gpu0_reserved : 0);
        free_b[r] = fr;
        cap[r] = fr > keep ? (int64_t)((fr - keep) / (per_expert ? per_expert : 1)) : 0;
        if (cap[r] > X) cap[r] = X;
        total += cap[r];
    }
    if (total < X) {
        char need[32], line[512] = "";
        size_t at = 0;
        for (int r = 0; r < ep->n && at < sizeof line; r++) {
            char f[32];
            at += (size_t)snprintf(line + at, sizeof line - at, "%s cuda:%d %s free", r ? "," : "",
                                   em_gpu_get_info(ep->d[r].gpu)->index, em_format_size(free_b[r], f, sizeof f));
        }
        return em_err_set(err, EM_ENOMEM,
                          "%s: the routed experts need %s (%d experts x %d MoE layers) beside the rest of the model, "
                          "and the %d devices hold %lld of the %d experts together (%s)",
                          ep->s.path, em_format_size(per_expert * (uint64_t)X, need, sizeof need), X, ep->s.n_layers,
                          ep->n, (long long)total, X, line);
    }
    for (int r = 0; r < ep->n; r++) {
        char f[32];
        if (cap[r] == 0)
            return em_err_set(err, EM_ENOMEM, "%s: cuda:%d has no room for one expert of each MoE layer (%s free)",
                              ep->s.path, em_gpu_get_info(ep->d[r].gpu)->index, em_format_size(free_b[r], f, sizeof f));
    }
    gk_ep_split(cap, ep->n, X, ep->first);
    return EM_OK;
}

void gk_ep_split(const int64_t *cap, int n, int n_expert, int *first) {
    /* one each, the rest in proportion to the room above that (at most cap - 1 each, as the
     * room is at least the rest), then what rounding left over one at a time to the largest
     * remainder where there is room */
    int64_t c[EM_GPU_MAX_SHARES], rem[EM_GPU_MAX_SHARES], room = 0, sum = n;
    const int64_t rest = n_expert - n;
    for (int r = 0; r < n; r++) room += cap[r] - 1;
    for (int r = 0; r < n; r++) {
        c[r] = 1 + (room ? rest * (cap[r] - 1) / room : 0);
        rem[r] = room ? rest * (cap[r] - 1) % room : 0;
        sum += c[r] - 1;
    }
    while (sum < n_expert) {
        int best = -1;
        for (int r = 0; r < n; r++)
            if (c[r] < cap[r] && (best < 0 || rem[r] > rem[best])) best = r;
        c[best]++, sum++, rem[best] = -1;
    }
    first[0] = 0;
    for (int r = 0; r < n; r++) first[r + 1] = first[r] + (int)c[r];
}

static int upload_experts(const ep_dev *d, const em_mat *m, int e0, int cnt, int64_t rows_per, const char *what, int layer,
                          em_gpu_mat *out, em_err *err) {
    char nm[96];
    snprintf(nm, sizeof nm, "MoE layer %d %s experts %d..%d", layer, what, e0, e0 + cnt - 1);
    const uint8_t *first = (const uint8_t *)m->data + m->row_bytes * (uint64_t)((int64_t)e0 * rows_per);
    return em_gpu_mat_upload(d->gpu, m->type, (int64_t)cnt * rows_per, m->cols, first, nm, out, err);
}

static int upload_share(gk_ep *ep, int r, em_err *err) {
    const bool tty = isatty(STDERR_FILENO);
    ep_dev *d = &ep->d[r];
    const int e0 = ep->first[r], cnt = ep->first[r + 1] - e0;
    d->share = calloc((size_t)ep->s.n_layers, sizeof *d->share);
    if (!d->share) return em_err_set(err, EM_ENOMEM, "out of memory for the expert shares");
    for (int l = 0; l < ep->s.n_layers; l++) {
        const gk_ep_layer *y = &ep->s.layers[l];
        ep_share *sh = &d->share[l];
        int rc = upload_experts(d, y->gate, e0, cnt, ep->s.ffn, "gate", l, &sh->gate, err);
        if (!rc) rc = upload_experts(d, y->up, e0, cnt, ep->s.ffn, "up", l, &sh->up, err);
        if (!rc) rc = upload_experts(d, y->down, e0, cnt, y->down->rows / ep->s.n_expert, "down", l, &sh->down, err);
        if (rc) {
            if (tty && l > 0) fputc('\n', stderr); /* after the progress line */
            return rc;
        }
        d->expert_bytes += sh->gate.bytes + sh->up.bytes + sh->down.bytes;
        if (tty)
            fprintf(stderr, "\rcuda:%d: uploading experts %d..%d of MoE layer %d of %d   %s",
                    em_gpu_get_info(d->gpu)->index, e0, e0 + cnt - 1, l + 1, ep->s.n_layers,
                    l + 1 == ep->s.n_layers ? "\n" : "");
    }
    return EM_OK;
}

static int make_buffers(gk_ep *ep, int r, em_err *err) {
    ep_dev *d = &ep->d[r];
    const uint64_t scratch = em_gpu_moe_scratch_bytes(ep->first[r + 1] - ep->first[r], ep->s.k, ep->s.ffn, ep->s.cols,
                                                      EP_ROWS);
    int rc = em_gpu_alloc(d->gpu, scratch, "expert share scratch", &d->scratch, err);
    if (!rc && r == 0) rc = em_gpu_alloc(d->gpu, (uint64_t)ep->n * slot_bytes(ep), "expert slots", (void **)&d->recv, err);
    if (!rc && r == 0) d->slots = d->recv;
    if (!rc && r > 0) rc = em_gpu_alloc(d->gpu, slot_bytes(ep), "expert slots", (void **)&d->slots, err);
    if (!rc && r > 0) rc = em_gpu_alloc(d->gpu, (uint64_t)EP_ROWS * ep->s.cols * 4, "expert input rows", (void **)&d->x, err);
    if (!rc && r > 0) rc = em_gpu_alloc(d->gpu, (uint64_t)EP_ROWS * ep->s.k * 4, "expert routes", (void **)&d->ids, err);
    return rc;
}

static void log_placement(const gk_ep *ep) {
    char line[1024];
    size_t at = 0;
    for (int r = 0; r < ep->n && at < sizeof line; r++) {
        char b[32];
        at += (size_t)snprintf(line + at, sizeof line - at, "%scuda:%d experts %d..%d (%s)", r ? ", " : "",
                               em_gpu_get_info(ep->d[r].gpu)->index, ep->first[r], ep->first[r + 1] - 1,
                               em_format_size(ep->d[r].expert_bytes, b, sizeof b));
    }
    em_log(EM_LOG_INFO, "%s: routed experts of %d MoE layers over %d device%s: %s", ep->s.path, ep->s.n_layers, ep->n,
           ep->n == 1 ? "" : "s", line);
}

int gk_ep_open(gk_ep **out, const gk_ep_spec *spec, em_err *err) {
    *out = NULL;
    if (!spec || spec->n_devices < 1 || spec->n_devices > EM_GPU_MAX_SHARES || !spec->gpu0 || spec->n_layers < 1 ||
        spec->n_expert < spec->n_devices || spec->k < 1 || spec->cols < 1)
        return em_err_set(err, EM_EINVAL, "several GPUs: %d devices (1..%d, and no more than the %d routed experts)",
                          spec ? spec->n_devices : 0, EM_GPU_MAX_SHARES, spec ? spec->n_expert : 0);
    gk_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return em_err_set(err, EM_ENOMEM, "out of memory for several GPUs");
    ep->s = *spec;
    ep->n = spec->n_devices;
    ep->d[0].gpu = spec->gpu0;
    int rc = EM_OK;
    for (int r = 1; r < ep->n && !rc; r++)
        if (!(rc = em_gpu_open(spec->devices[r], &ep->d[r].gpu, err))) ep->d[r].owned = true;
    em_gpu *gpus[EM_GPU_MAX_SHARES];
    for (int r = 0; r < ep->n; r++) gpus[r] = ep->d[r].gpu;
    uint64_t per_expert = 0;
    if (!rc) rc = em_gpu_ep_open(gpus, ep->n, &ep->comm, err);
    if (!rc) rc = bytes_per_expert(spec, &per_expert, err);
    if (!rc) rc = place(ep, per_expert, err);
    for (int r = 0; r < ep->n && !rc; r++)
        if (!(rc = upload_share(ep, r, err))) rc = make_buffers(ep, r, err);
    if (rc) {
        gk_ep_close(ep);
        return rc;
    }
    log_placement(ep);
    ep->s.layers = NULL, ep->s.devices = NULL; /* the caller's, needed only to open */
    *out = ep;
    return EM_OK;
}

void gk_ep_close(gk_ep *ep) {
    if (!ep) return;
    em_gpu_ep_close(ep->comm);
    for (int r = 0; r < ep->n; r++) {
        ep_dev *d = &ep->d[r];
        if (!d->gpu) continue;
        for (int l = 0; d->share && l < ep->s.n_layers; l++)
            em_gpu_mat_free(d->gpu, &d->share[l].gate), em_gpu_mat_free(d->gpu, &d->share[l].up),
                em_gpu_mat_free(d->gpu, &d->share[l].down);
        free(d->share);
        em_gpu_free(d->gpu, d->scratch);
        if (r == 0) em_gpu_free(d->gpu, d->recv);
        else em_gpu_free(d->gpu, d->slots), em_gpu_free(d->gpu, d->x), em_gpu_free(d->gpu, d->ids);
        if (d->owned) em_gpu_close(d->gpu);
    }
    free(ep);
}

int gk_ep_moe(gk_ep *ep, int layer, const float *x, int64_t ldx, int n, const em_gpu_act *x_act, const int32_t *ids,
              const float *wts, float *y, int64_t ldy, em_err *err) {
    if (layer < 0 || layer >= ep->s.n_layers || ldx != ep->s.cols || n < 1 || n > EP_ROWS)
        return em_err_set(err, EM_EINVAL, "several GPUs: MoE layer %d of %d, %d rows (1..%d), ldx %lld (%lld)", layer,
                          ep->s.n_layers, n, EP_ROWS, (long long)ldx, (long long)ep->s.cols);
    const int K = ep->s.k;
    void *xs[EM_GPU_MAX_SHARES], *is[EM_GPU_MAX_SHARES], *dst[EM_GPU_MAX_SHARES];
    const void *src[EM_GPU_MAX_SHARES];
    em_gpu_moe_parts parts = { .n = ep->n };
    for (int r = 0; r < ep->n; r++) {
        xs[r] = r ? ep->d[r].x : (void *)x, is[r] = r ? ep->d[r].ids : (void *)ids;
        src[r] = ep->d[r].slots;
        dst[r] = ep->d[0].recv + (uint64_t)r * slot_bytes(ep) / 4;
        parts.out[r] = dst[r], parts.first[r] = ep->first[r];
    }
    parts.first[ep->n] = ep->first[ep->n];
    int rc = em_gpu_ep_broadcast(ep->comm, xs, (uint64_t)n * ep->s.cols * 4, err);
    if (!rc) rc = em_gpu_ep_broadcast(ep->comm, is, (uint64_t)n * K * 4, err);
    for (int r = 0; r < ep->n && !rc; r++) {
        const ep_dev *d = &ep->d[r];
        const ep_share *sh = &d->share[layer];
        const em_gpu_experts ex = { .gate = &sh->gate, .up = &sh->up, .down = &sh->down,
                                    .n_expert = ep->first[r + 1] - ep->first[r], .ffn = ep->s.ffn, .act = ep->s.act,
                                    .situ_beta = ep->s.situ_beta, .situ_lin_beta = ep->s.situ_lin_beta };
        rc = em_gpu_moe_share(d->gpu, &ex, ep->first[r], xs[r], ep->s.cols, n, r ? NULL : x_act, is[r], K, d->scratch,
                              d->slots, err);
    }
    if (!rc) rc = em_gpu_ep_gather(ep->comm, src, dst, (uint64_t)n * K * ep->s.cols * 4, err);
    if (!rc) rc = em_gpu_moe_combine(ep->d[0].gpu, &parts, ids, wts, n, K, ep->s.cols, y, ldy, err);
    return rc ? em_err_prefix(err, "MoE layer %d over %d devices", layer, ep->n) : EM_OK;
}
