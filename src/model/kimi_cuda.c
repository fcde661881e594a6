/* The kimi-linear / kimi-k3 target on one CUDA device: the second implementation of model.h's
 * em_target_ops, in C over backend/gpu.h (docs/cuda.md is the design). kimi_load reads and
 * checks the file exactly as for the CPU target; its hook lists every weight, the fit check
 * sums what the device needs, and each weight is uploaded once. The forward is kimi.c's, op
 * for op, on device buffers: the CPU target stays the reference it is tested against.
 *
 * Invariants:
 * - A pass is at most EM_GPU_MAX_ROWS rows, but for a prefill's wide passes of up to GK_WIDE
 *   rows (their own buffers and KDA log; MLA's cache and attention in chunks of EM_GPU_MAX_ROWS;
 *   a full one's layers are one CUDA graph, captured once). A verify of n <= max_verify rows is
 *   one pass whose layers are one CUDA graph per width n (captured the first time that width
 *   runs, replayed after), its LM head another, and commit(k) a third per k: buffers are fixed,
 *   and the tokens and the position are uploaded to fixed device slots before a replay.
 * - Nothing returns to the host inside a pass: routing, the union of routed experts and the
 *   argmaxes are made on the device; at its end only what em_rows asks for is downloaded
 *   (argmaxes: 4 bytes a row).
 * - Verify never writes committed state: KDA rows go to the transition logs (ReplaySSM) and
 *   commit(k) folds k of them on the device; MLA rows >= pos are scratch, kept by advancing
 *   pos. A verify wider than the logs snapshots the KDA states, runs in committing passes,
 *   restores them, and its commit replays the accepted tokens (as the CPU target does).
 * - Every op keeps width invariance (gpu.h), so a verify row is bit-identical to a one-row
 *   decode of the same token: greedy speculative output equals plain output on this target.
 * - Routed experts are resident in device memory (no SSD mode on the GPU yet): on this device,
 *   or with `--devices` spread over several (kimi_cuda_ep.c), where passes run their kernels
 *   as they are issued, without graphs. */
#include "backend/gpu.h"
#include "model/arch.h"
#include "model/kimi_cuda_ep.h"
#include "model/kimi_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GK_ROWS EM_GPU_MAX_ROWS
/* Rows of a wide prefill pass (wide_pass): its routed experts over them all at once. */
#define GK_WIDE EM_GPU_WIDE_MAX_ROWS
/* Rows of features a call may leave on the device (em_rows.device_features): the decode loop's
 * prefill calls (decode/loop.c PREFILL_CHUNK). */
#define GK_FEATURE_ROWS 128
/* Device memory kept free beyond what the target allocates: the CUDA context's own heaps,
 * graphs, and the products' launch-time needs. */
#define GK_MARGIN_BYTES (512ull << 20)
/* The nominal device for the scheduler's costs (docs/cuda.md "Costs per device"). */
#define GK_NOMINAL_BPS 4.6e12
#define GK_NOMINAL_KERNEL_S 1.0e-6

/* ---- the weight table ----------------------------------------------------------------------
 * One entry per matrix or vector kimi_load made, keyed by the host address of its values (a
 * mapped tensor, or an f32 copy in the loader's store), which the forward looks up. */
typedef struct gk_weight {
    const void *key;
    char name[96];
    bool is_vec;
    bool expert_stack;  /* routed experts that kimi_cuda_ep.c places (several devices) */
    em_mat m;           /* matrices: the host view */
    int64_t n;          /* vectors: values */
    em_gpu_mat dm;      /* matrices on the device */
    float *dv;          /* vectors on the device */
} gk_weight;

typedef struct gk_table {
    gk_weight *w;
    int n, cap;
    int *slot;          /* open addressing over key, -1: empty */
    int n_slot;
} gk_table;

enum gk_mode { GK_LOGGED, GK_COMMIT };

typedef struct gk_layer_dev {
    const float *attn_norm, *ffn_norm, *attn_res, *ffn_res;
    em_gpu_kda_params kda;
    const float *q_a_norm, *kv_a_norm, *router_bias, *routed_norm;
} gk_layer_dev;

/* Per-pass device buffers, GK_ROWS rows each (carved from one allocation). */
typedef struct gk_bufs {
    int32_t *tok, *pos, *argmax, *ids; /* ids: [n_moe][GK_ROWS][K] */
    float *x, *h, *y, *hh;
    float *qkv, *f, *g2, *o, *b, *low_f, *low_g;              /* KDA */
    float *q, *q_lora, *kv, *qa, *ctx, *mo, *mgate, *attn;     /* MLA */
    float *dg, *du, *logits_r, *wts, *sg, *su, *ys, *lx, *ls;  /* FFN */
    void *moe;
    float *bank, *mix;                                        /* K3 AttnRes */
    float *feat, *logits;
    float *feat_out;    /* [GK_FEATURE_ROWS][n_feat]: a call's features kept on the device */
    uint8_t *act;       /* bump region for activations, reset per layer half */
    uint64_t act_cap, act_used;
} gk_bufs;

/* A wide prefill pass's own buffers (allocated at the first one; carve_bufs with wide). */
typedef struct gk_wide {
    void *mem;
    gk_bufs b;
    em_gpu_kda_log log;          /* GK_WIDE rows, for each KDA layer in turn (its pass commits them all) */
    bool failed;                 /* the allocation failed once: narrow passes only */
} gk_wide;

typedef struct gk {
    em_target base;
    em_gguf *g;
    kimi_hparams hp;
    kimi_weights w;
    em_gpu *gpu;
    gk_ep *ep;               /* routed experts over several devices, or NULL */
    int index;
    char device[300];
    gk_table tab;
    gk_layer_dev *ld;        /* [n_layer] device vectors of each layer */
    const float *output_norm, *output_res;
    int feature_layer[EM_MODEL_MAX_FEATURE_LAYERS];
    int n_feature_layers;
    int n_moe, max_banks;
    /* sequence state */
    em_gpu_kda_dims kd;
    em_gpu_mla_dims md;
    em_gpu_kda_state *kst;   /* [n_kda] */
    em_gpu_kda_log *klog;    /* [n_kda] */
    float **cache;           /* [n_mla] */
    void *state_mem, *backup_mem, *log_mem, *cache_mem, *buf_mem;
    uint64_t state_bytes;    /* every KDA state, contiguous in state_mem */
    gk_bufs B;
    gk_wide W;
    gk_bufs *P;              /* the buffers the layers run on: &B, or &W.b during a wide pass */
    int wide;                /* prefills of at least this many rows run wide passes (0: never) */
    em_gpu_graph *g_body[2][GK_ROWS + 1], *g_head[GK_ROWS + 1], *g_commit[GK_ROWS + 1];
    em_gpu_graph *g_wide;    /* the layers of a full wide pass (GK_WIDE rows) */
    int32_t *replay_tok;     /* [n_ctx] tokens of the last wide verify */
    bool replay;
    int32_t h_ids_n;
    int32_t *h_ids;          /* host copy of the ids, [n_moe][GK_ROWS][K] */
    /* costs */
    uint64_t dense_bytes, expert_bytes;
    double cost_scale;
} gk;

static uint64_t align256(uint64_t v) { return (v + 255) & ~(uint64_t)255; }

/* Device buffers laid out from base, 256-byte aligned (base NULL: only measured). */
typedef struct carver {
    uint8_t *base;
    uint64_t at;
} carver;

static void *carve(carver *c, uint64_t bytes) {
    const uint64_t o = c->at;
    c->at += align256(bytes ? bytes : 1);
    return c->base ? c->base + o : NULL;
}

static uint64_t maxu(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Pass buffers of R rows laid out from c (c->base NULL: only measured): a narrow pass's (B,
 * GK_ROWS), or a wide pass's (wide: R = GK_WIDE rows of what its layers run over all rows; the
 * tokens and first position of each chunk of GK_ROWS, laid out as pass_inputs lays them; none
 * of what only chunks or the head use, which come from B). */
static void carve_bufs(gk *k, carver *c, gk_bufs *B, uint64_t R, bool wide) {
    const kimi_hparams *hp = &k->hp;
    const uint64_t E = (uint64_t)hp->n_embd, D = (uint64_t)hp->d_inner, F4 = sizeof(float);
    const uint64_t H = (uint64_t)hp->mla_heads, C = (uint64_t)hp->kv_lora + (uint64_t)hp->rope;
    const uint64_t qk = (uint64_t)hp->nope + (uint64_t)hp->rope, ldo = H * (uint64_t)hp->v_head;
    const uint64_t K = (uint64_t)hp->n_expert_used, X = (uint64_t)hp->n_expert;
    uint64_t lat = 0, f_sh = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        lat = maxu(lat, (uint64_t)k->w.layers[l].ffn.routed_down.rows);
        f_sh = maxu(f_sh, (uint64_t)k->w.layers[l].ffn.gate_sh.rows);
    }
    memset(B, 0, sizeof *B);
    const uint64_t chunks = R / GK_ROWS;
    B->tok = carve(c, chunks * (GK_ROWS + 1) * 4); /* the tokens, then the first position: one upload */
    B->pos = c->base ? B->tok + GK_ROWS : NULL;
    B->ids = carve(c, (uint64_t)(k->n_moe && !wide ? k->n_moe : 1) * R * (K ? K : 1) * 4);
    B->x = carve(c, R * E * F4), B->h = carve(c, R * E * F4), B->y = carve(c, R * E * F4);
    if (hp->n_kda) {
        B->qkv = carve(c, R * 3 * D * F4), B->f = carve(c, R * D * F4), B->g2 = carve(c, R * D * F4);
        B->o = carve(c, R * D * F4), B->b = carve(c, R * (uint64_t)hp->kda_heads * F4);
        B->low_f = carve(c, R * (uint64_t)hp->kda_head_dim * F4), B->low_g = carve(c, R * (uint64_t)hp->kda_head_dim * F4);
    }
    if (hp->n_mla) {
        B->q = carve(c, R * H * qk * F4), B->q_lora = carve(c, R * (uint64_t)hp->q_lora * F4);
        B->kv = carve(c, R * C * F4), B->mo = carve(c, R * ldo * F4), B->mgate = carve(c, R * ldo * F4);
        B->qa = carve(c, R * H * C * F4), B->ctx = carve(c, R * H * (uint64_t)hp->kv_lora * F4);
    }
    B->dg = carve(c, R * (uint64_t)hp->n_ff * F4), B->du = carve(c, R * (uint64_t)hp->n_ff * F4);
    if (k->n_moe) {
        B->logits_r = carve(c, R * X * F4), B->wts = carve(c, R * K * F4);
        B->sg = carve(c, R * f_sh * F4), B->su = carve(c, R * f_sh * F4), B->ys = carve(c, R * E * F4);
        B->moe = carve(c, wide ? em_gpu_moe_wide_scratch_bytes(hp->n_expert, hp->n_expert_used, hp->n_ff_exp, E, GK_WIDE)
                              : em_gpu_moe_scratch_bytes(hp->n_expert, hp->n_expert_used, hp->n_ff_exp,
                                                         (int64_t)(lat ? lat : E), GK_ROWS));
    }
    B->feat = carve(c, R * (uint64_t)(k->base.info.n_feat ? k->base.info.n_feat : 1) * F4);
    if (!wide) { /* what only a narrow pass, a wide pass's chunks or the head use */
        B->argmax = carve(c, R * 4);
        B->hh = carve(c, R * E * F4);
        if (hp->n_mla) B->attn = carve(c, em_gpu_mla_scratch_floats(&k->md, GK_ROWS) * F4);
        if (k->n_moe) B->lx = carve(c, R * lat * F4), B->ls = carve(c, R * lat * F4);
        if (hp->res_block > 0) B->bank = carve(c, (uint64_t)k->max_banks * R * E * F4), B->mix = carve(c, R * E * F4);
        B->feat_out = carve(c, (k->base.info.n_feat ? GK_FEATURE_ROWS : 1) * (uint64_t)k->base.info.n_feat * F4);
        B->logits = carve(c, R * (uint64_t)hp->n_vocab * F4);
    }
    /* activations of a layer half: at most eight Q8_0 inputs of the widest row, and the
     * per-head products' own */
    uint64_t widest = maxu(maxu(E, D), maxu(maxu((uint64_t)hp->n_ff, f_sh), maxu(ldo, maxu(lat, (uint64_t)hp->q_lora))));
    widest = maxu(widest, maxu((uint64_t)hp->n_ff_exp, H * (uint64_t)hp->kv_lora));
    B->act_cap = 8 * align256(em_gpu_act_bytes(EM_TYPE_Q8_0, (int64_t)widest, (int)R)) +
                 2 * align256(em_gpu_matmul_heads_scratch_bytes(EM_TYPE_Q8_0, hp->mla_heads ? hp->mla_heads : 1,
                                                               (int64_t)maxu((uint64_t)hp->kv_lora, (uint64_t)hp->nope),
                                                               (int)R) + 65536);
    B->act = carve(c, B->act_cap);
}

static int table_add(gk_table *t, const gk_weight *w, em_err *err) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        gk_weight *nw = realloc(t->w, (size_t)cap * sizeof *nw);
        if (!nw) return em_err_set(err, EM_ENOMEM, "out of memory for the GPU weight table");
        t->w = nw;
        t->cap = cap;
    }
    t->w[t->n++] = *w;
    return EM_OK;
}

static uint64_t key_hash(const void *p) {
    uint64_t v = (uint64_t)(uintptr_t)p;
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdull;
    return v ^ (v >> 33);
}

static int table_index(gk_table *t, em_err *err) {
    t->n_slot = 16;
    while (t->n_slot < 2 * t->n) t->n_slot *= 2;
    t->slot = malloc((size_t)t->n_slot * sizeof *t->slot);
    if (!t->slot) return em_err_set(err, EM_ENOMEM, "out of memory for the GPU weight table");
    for (int i = 0; i < t->n_slot; i++) t->slot[i] = -1;
    for (int i = 0; i < t->n; i++) {
        uint64_t s = key_hash(t->w[i].key) & (uint64_t)(t->n_slot - 1);
        while (t->slot[s] >= 0) {
            if (t->w[t->slot[s]].key == t->w[i].key) break; /* the same tensor twice (tied) */
            s = (s + 1) & (uint64_t)(t->n_slot - 1);
        }
        if (t->slot[s] < 0) t->slot[s] = i;
    }
    return EM_OK;
}

static const gk_weight *table_find(const gk_table *t, const void *key) {
    if (!key || !t->slot) return NULL;
    uint64_t s = key_hash(key) & (uint64_t)(t->n_slot - 1);
    for (; t->slot[s] >= 0; s = (s + 1) & (uint64_t)(t->n_slot - 1))
        if (t->w[t->slot[s]].key == key) return &t->w[t->slot[s]];
    return NULL;
}

/* The device copy of a host matrix (NULL when the model has none: rows == 0). */
static const em_gpu_mat *dmat(const gk *k, const em_mat *m) {
    if (!m || m->rows == 0) return NULL;
    const gk_weight *w = table_find(&k->tab, m->data);
    return w && !w->is_vec ? &w->dm : NULL;
}

static const float *dvec(const gk *k, const float *v) {
    const gk_weight *w = v ? table_find(&k->tab, v) : NULL;
    return w && w->is_vec ? w->dv : NULL;
}

static int hook_mat(void *ud, const char *name, em_mat *m, em_err *err) {
    gk_weight w = { .key = m->data, .m = *m };
    snprintf(w.name, sizeof w.name, "%s", name);
    return table_add(&((gk *)ud)->tab, &w, err);
}

static int hook_vec(void *ud, const char *name, const float *v, int64_t n, em_err *err) {
    gk_weight w = { .key = v, .is_vec = true, .n = n };
    snprintf(w.name, sizeof w.name, "%s", name);
    return table_add(&((gk *)ud)->tab, &w, err);
}

/* ---- activations ---------------------------------------------------------------------------
 * A pass's input rows for the products: F32 weights read them as they are, integer weights
 * from a Q8_0 copy made once per input (the CPU's em_acts does the same). */
typedef struct gk_acts {
    const float *x;
    int64_t ldx, cols;
    int n;
    bool have_q;
    em_gpu_act q;
} gk_acts;

static gk_acts acts_of(const float *x, int64_t ldx, int64_t cols, int n) {
    return (gk_acts){ .x = x, .ldx = ldx, .cols = cols, .n = n };
}

static int bump(gk *k, uint64_t bytes, void **out, em_err *err) {
    bytes = align256(bytes);
    gk_bufs *B = k->P;
    if (B->act_used + bytes > B->act_cap)
        return em_err_set(err, EM_ENOMEM, "GPU activation scratch: %llu bytes needed past %llu",
                          (unsigned long long)(B->act_used + bytes), (unsigned long long)B->act_cap);
    *out = B->act + B->act_used;
    B->act_used += bytes;
    return EM_OK;
}

/* Makes a's Q8_0 copy now when w needs one (once per input: branches forked next share it). */
static int acts_ready(gk *k, gk_acts *a, const em_mat *w, em_err *err) {
    const em_gpu_mat *dw = dmat(k, w);
    if (!dw || a->have_q || em_gpu_act_type(dw->type) != EM_TYPE_Q8_0) return EM_OK;
    void *s = NULL;
    int rc = bump(k, em_gpu_act_bytes(EM_TYPE_Q8_0, a->cols, a->n), &s, err);
    if (!rc) rc = em_gpu_act_prepare(k->gpu, EM_TYPE_Q8_0, a->x, a->ldx, a->cols, a->n, s, &a->q, err);
    a->have_q = !rc;
    return rc;
}

/* a's Q8_0 copy made inside w's product (em_gpu_act_in_block) where that applies: a launch
 * less. With up, the rows quantized are glu(a's rows, up), the model's MLP activation. */
static bool acts_in_block(gk *k, gk_acts *a, const em_mat *w, const float *up) {
    const kimi_hparams *hp = &k->hp;
    const em_gpu_mat *dw = dmat(k, w);
    if (!dw || a->have_q) return false;
    const int act = hp->situ ? EM_GPU_ACT_SITU : EM_GPU_ACT_SWIGLU;
    a->have_q = em_gpu_act_in_block(dw->type, a->x, up, a->ldx, a->cols, a->n, act, hp->situ_beta, hp->situ_lin_beta, &a->q);
    return a->have_q;
}

/* y (ldy) = W x for the rows of a. */
static int mm(gk *k, gk_acts *a, const em_mat *w, float *d_y, int64_t ldy, em_err *err) {
    const em_gpu_mat *dw = dmat(k, w);
    if (!dw) return em_err_set(err, EM_EINVAL, "GPU target: a matrix of %lld rows was not uploaded", (long long)w->rows);
    em_gpu_act f32;
    int rc = acts_ready(k, a, w, err);
    if (!rc && em_gpu_act_type(dw->type) != EM_TYPE_Q8_0)
        rc = em_gpu_act_prepare(k->gpu, dw->type, a->x, a->ldx, a->cols, a->n, NULL, &f32, err);
    if (rc) return rc;
    return em_gpu_matmul(k->gpu, dw, em_gpu_act_type(dw->type) == EM_TYPE_Q8_0 ? &a->q : &f32, d_y, ldy, err);
}

/* Whether the products are all Q8_0 or F32 with both present: one mixed launch takes them. */
static bool q8_f32_mix(gk *k, const em_mat *const *w, int n) {
    bool q8 = false, f32 = false;
    for (int i = 0; i < n; i++) {
        const em_gpu_mat *d = dmat(k, w[i]);
        if (!d || (d->type != EM_TYPE_Q8_0 && d->type != EM_TYPE_F32)) return false;
        q8 |= d->type == EM_TYPE_Q8_0, f32 |= d->type == EM_TYPE_F32;
    }
    return q8 && f32;
}

/* Several products of one input, one launch per device type among them, or one for Q8_0 and
 * F32 together (em_gpu_matmul_multi: each output bit-identical to its own em_gpu_matmul). */
static int mm_many(gk *k, gk_acts *a, const em_mat *const *w, float *const *d_y, const int64_t *ldy, int n,
                   em_err *err) {
    em_gpu_mm_out outs[EM_GPU_MULTI_MAX];
    bool done[EM_GPU_MULTI_MAX] = { false };
    if (n > EM_GPU_MULTI_MAX) return em_err_set(err, EM_EINVAL, "GPU target: %d products of one input", n);
    if (q8_f32_mix(k, w, n)) {
        int rc = EM_OK;
        for (int i = 0; i < n && !rc; i++) {
            outs[i] = (em_gpu_mm_out){ dmat(k, w[i]), d_y[i], ldy[i] };
            if (outs[i].w->type == EM_TYPE_Q8_0) rc = acts_ready(k, a, w[i], err);
        }
        return rc ? rc : em_gpu_matmul_multi(k->gpu, outs, n, &a->q, err);
    }
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        const em_gpu_mat *di = dmat(k, w[i]);
        if (!di) return em_err_set(err, EM_EINVAL, "GPU target: a matrix of %lld rows was not uploaded", (long long)w[i]->rows);
        int m = 0;
        for (int j = i; j < n; j++) {
            const em_gpu_mat *dj = dmat(k, w[j]);
            if (done[j] || !dj || dj->type != di->type) continue;
            outs[m++] = (em_gpu_mm_out){ dj, d_y[j], ldy[j] };
            done[j] = true;
        }
        em_gpu_act f32;
        int rc = acts_ready(k, a, w[i], err);
        if (!rc && em_gpu_act_type(di->type) != EM_TYPE_Q8_0)
            rc = em_gpu_act_prepare(k->gpu, di->type, a->x, a->ldx, a->cols, a->n, NULL, &f32, err);
        if (!rc) rc = em_gpu_matmul_multi(k->gpu, outs, m, em_gpu_act_type(di->type) == EM_TYPE_Q8_0 ? &a->q : &f32, err);
        if (rc) return rc;
    }
    return EM_OK;
}

/* Per head h: y[j][h * ys + r] = W[h * head_rows + r] . x[j][h * xs ..] (MLA's absorbed
 * query and value up-projection, all heads in one op). */
static int mm_heads(gk *k, const em_mat *w, int64_t head_rows, const float *d_x, int64_t ldx, int64_t xs,
                    int64_t cols, int n, float *d_y, int64_t ldy, int64_t ys, em_err *err) {
    const em_gpu_mat *dw = dmat(k, w);
    if (!dw) return em_err_set(err, EM_EINVAL, "GPU target: a per-head matrix was not uploaded");
    void *s = NULL;
    const uint64_t sb = em_gpu_matmul_heads_scratch_bytes(dw->type, k->hp.mla_heads, cols, n);
    int rc = sb ? bump(k, sb, &s, err) : EM_OK;
    if (rc) return rc;
    return em_gpu_matmul_heads(k->gpu, dw, k->hp.mla_heads, head_rows, d_x, ldx, xs, cols, n, s, d_y, ldy, ys, err);
}

/* ---- the layers ------------------------------------------------------------------------------ */

static int glu(gk *k, float *g, const float *u, int64_t count, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    if (hp->situ) return em_gpu_situ(k->gpu, g, u, count, hp->situ_beta, hp->situ_lin_beta, g, err);
    return em_gpu_swiglu(k->gpu, g, u, count, g, err);
}

/* The device slot of the first position of the chunk holding pass row r (pass_inputs' layout,
 * once per chunk of GK_ROWS in a wide pass). */
static const int32_t *chunk_pos(const gk_bufs *B, int r) { return B->tok + r / GK_ROWS * (GK_ROWS + 1) + GK_ROWS; }

/* The layers take their normed input as xa (k->P->h, with its Q8_0 copy when the norm made
 * one) and run on k->P's buffers: a narrow pass's, or a wide pass's over all its rows (then
 * what runs per GK_ROWS rows, the KDA recurrence and the MLA cache and attention, loops over
 * chunks). */
static int kda_layer(gk *k, int l, gk_acts *xa, int mode, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const kimi_layer *ly = &k->w.layers[l];
    const kimi_kda_w *w = &ly->kda;
    const int64_t D = hp->d_inner, hd = hp->kda_head_dim;
    const int n = xa->n;
    gk_bufs *B = k->P;
    const bool full_gate = w->g.rows > 0; /* K3: g2 = ssm_g x, no low-rank pair */
    if (n > GK_ROWS && mode != GK_COMMIT)
        return em_err_set(err, EM_EINVAL, "GPU target: %d KDA rows in one logged pass (at most %d)", n, GK_ROWS);
    /* the six products of the normed input in one launch, then the two low-rank ups side by side */
    gk_acts fa = acts_of(B->low_f, hd, hd, n), ga = acts_of(B->low_g, hd, hd, n);
    em_gpu *g = k->gpu;
    const em_mat *from_x[] = { &w->q, &w->k, &w->v, &w->beta, &w->f_a, full_gate ? &w->g : &w->g_a };
    float *const y_x[] = { B->qkv, B->qkv + D, B->qkv + 2 * D, B->b, B->low_f, full_gate ? B->g2 : B->low_g };
    const int64_t ld_x[] = { 3 * D, 3 * D, 3 * D, hp->kda_heads, hd, full_gate ? D : hd };
    int rc = mm_many(k, xa, from_x, y_x, ld_x, 6, err);
    if (rc || (rc = em_gpu_fork(g, 1, err))) return rc;
    acts_in_block(k, &fa, &w->f_b, NULL); /* the low-rank inputs quantized inside the ups */
    if (!full_gate) acts_in_block(k, &ga, &w->g_b, NULL);
    rc = mm(k, &fa, &w->f_b, B->f, D, err);
    if (!rc && !full_gate && !(rc = em_gpu_branch(g, 1, err))) rc = mm(k, &ga, &w->g_b, B->g2, D, err);
    int rc2 = em_gpu_join(g, err);
    if (rc || (rc = rc2)) return rc;
    em_gpu_kda_state *st = &k->kst[ly->slot];
    /* a wide pass's recurrence runs all its rows in one call on the wide log; a narrow pass's
     * on the layer's own log */
    em_gpu_kda_log *log = B == &k->W.b ? &k->W.log : &k->klog[ly->slot];
    /* the output's Q8_0 activations in the forward's launch when the output projection takes them
     * (a pass of GK_ROWS rows at most; a wide pass's product quantizes all its rows at once,
     * with the same bits) */
    gk_acts oa = acts_of(B->o, D, D, n);
    const em_gpu_mat *dout = dmat(k, &w->out);
    void *q8 = NULL;
    if (n <= GK_ROWS && dout && em_gpu_act_type(dout->type) == EM_TYPE_Q8_0 &&
        (rc = bump(k, em_gpu_act_bytes(EM_TYPE_Q8_0, D, n), &q8, err)))
        return rc;
    for (int r = 0; r < n && !rc; r += log->max_rows) { /* the recurrence in chunks of the log's rows */
        const int m = n - r < log->max_rows ? n - r : log->max_rows;
        const float *qkv = B->qkv + r * 3 * D, *f = B->f + r * D, *b = B->b + r * hp->kda_heads, *g2 = B->g2 + r * D;
        if (mode == GK_COMMIT) /* a committing pass: the recurrence commits as it goes */
            rc = em_gpu_kda_forward_commit(g, &k->kd, &k->ld[l].kda, st, m, qkv, f, b, g2, B->o + r * D, q8,
                                           q8 ? &oa.q : NULL, log, err);
        else
            rc = em_gpu_kda_forward(g, &k->kd, &k->ld[l].kda, st, m, qkv, f, b, g2, B->o + r * D, q8, q8 ? &oa.q : NULL,
                                    log, err);
    }
    if (rc) return rc;
    oa.have_q = q8 != NULL;
    return mm(k, &oa, &w->out, B->y, hp->n_embd, err);
}

/* MLA in the absorbed form over the device latent cache (mla.c's steps). */
static int mla_layer(gk *k, int l, gk_acts *xa, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const kimi_mla_w *w = &k->w.layers[l].mla;
    const gk_layer_dev *dl = &k->ld[l];
    gk_bufs *B = k->P, *N = &k->B; /* N: a chunk's attention scratch */
    const int H = hp->mla_heads, R = hp->kv_lora, C = hp->kv_lora + hp->rope, qk = hp->nope + hp->rope;
    const int64_t ldq = (int64_t)H * qk, ldo = (int64_t)H * hp->v_head;
    float *cache = k->cache[k->w.layers[l].slot];
    const int n = xa->n;
    em_gpu *g = k->gpu;
    /* the queries (or their LoRA down) and the latents in one launch; then the q LoRA up beside
     * the new cache rows */
    const em_mat *from_x[] = { hp->q_lora ? &w->q_a : &w->q, &w->kv_a };
    float *const y_x[] = { hp->q_lora ? B->q_lora : B->q, B->kv };
    const int64_t ld_x[] = { hp->q_lora ? hp->q_lora : ldq, C };
    int rc = mm_many(k, xa, from_x, y_x, ld_x, 2, err);
    if (rc || (rc = em_gpu_fork(g, 1, err))) return rc;
    if (hp->q_lora) {
        gk_acts la = acts_of(B->q_lora, hp->q_lora, hp->q_lora, n);
        if (!(rc = em_gpu_rmsnorm_rows(g, B->q_lora, hp->q_lora, dl->q_a_norm, KIMI_MLA_NORM_EPS, n, hp->q_lora,
                                       B->q_lora, hp->q_lora, err)))
            rc = mm(k, &la, &w->q_b, B->q, ldq, err);
    }
    /* the new cache rows, chunk by chunk (pass_inputs' layout: a chunk's first position after
     * its GK_ROWS tokens) */
    if (!rc && !(rc = em_gpu_branch(g, 1, err)))
        for (int r = 0; r < n && !rc; r += GK_ROWS)
            rc = em_gpu_mla_append(g, &k->md, cache, chunk_pos(B, r), n - r < GK_ROWS ? n - r : GK_ROWS,
                                   B->kv + (int64_t)r * C, C, dl->kv_a_norm, KIMI_MLA_NORM_EPS, err);
    int rc2 = em_gpu_join(g, err);
    if (rc || (rc = rc2)) return rc;
    /* the absorbed queries [W_UK_h^T q_nope_h | q_pe_h] per head of every row, then per chunk
     * the attention over the cache (each row up to its own position), then the value
     * up-projection of every row */
    if ((rc = mm_heads(k, &w->k_b, R, B->q, ldq, qk, hp->nope, n, B->qa, (int64_t)H * C, C, err)) ||
        (rc = em_gpu_copy_2d(k->gpu, B->qa + R, (uint64_t)C * sizeof(float), B->q + hp->nope, (uint64_t)qk * sizeof(float),
                             (uint64_t)hp->rope * sizeof(float), (uint64_t)n * H, err)))
        return rc;
    for (int r = 0; r < n && !rc; r += GK_ROWS)
        rc = em_gpu_mla_attend(k->gpu, &k->md, cache, chunk_pos(B, r), n - r < GK_ROWS ? n - r : GK_ROWS,
                               B->qa + (int64_t)r * H * C, (int64_t)H * C, N->attn, B->ctx + (int64_t)r * H * R,
                               (int64_t)H * R, err);
    if (rc || (rc = mm_heads(k, &w->v_b, hp->v_head, B->ctx, (int64_t)H * R, R, R, n, B->mo, ldo, hp->v_head, err)))
        return rc;
    if (w->gate.rows > 0 && /* K3 output gate */
        ((rc = mm(k, xa, &w->gate, B->mgate, ldo, err)) ||
         (rc = em_gpu_sigmoid_mul(k->gpu, B->mo, B->mgate, (int64_t)n * ldo, err))))
        return rc;
    gk_acts oa = acts_of(B->mo, ldo, ldo, n);
    return mm(k, &oa, &w->out, B->y, hp->n_embd, err);
}

/* a's rows made glu(a's rows, up) for w: quantized in the launch that makes them when w takes
 * Q8_0 activations (em_gpu_act_prepare_glu), else in place (a's rows are contiguous). */
static int acts_glu(gk *k, gk_acts *a, const em_mat *w, const float *up, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const em_gpu_mat *dw = dmat(k, w);
    if (!dw || em_gpu_act_type(dw->type) != EM_TYPE_Q8_0 || a->cols % 32)
        return glu(k, (float *)a->x, up, (int64_t)a->n * a->cols, err);
    void *s = NULL;
    const int act = hp->situ ? EM_GPU_ACT_SITU : EM_GPU_ACT_SWIGLU;
    int rc = bump(k, em_gpu_act_bytes(EM_TYPE_Q8_0, a->cols, a->n), &s, err);
    if (!rc) rc = em_gpu_act_prepare_glu(k->gpu, EM_TYPE_Q8_0, a->x, up, a->ldx, a->cols, a->n, act, hp->situ_beta,
                                         hp->situ_lin_beta, s, &a->q, err);
    a->have_q = !rc;
    return rc;
}

/* y (ldy) = down(glu(g, u)) for n rows of F values (g may be overwritten). */
static int mlp_down(gk *k, float *g, const float *u, int64_t F, int n, const em_mat *down, float *d_y, int64_t ldy,
                    em_err *err) {
    gk_acts ga = acts_of(g, F, F, n);
    int rc = acts_in_block(k, &ga, down, u) ? EM_OK : acts_glu(k, &ga, down, u, err); /* in block: the product makes them */
    return rc ? rc : mm(k, &ga, down, d_y, ldy, err);
}

/* y (ldy) = down(glu(gate x, up x)) for the n rows of a; g, u: [GK_ROWS][gate rows]. */
static int mlp(gk *k, gk_acts *a, const em_mat *gate, const em_mat *up, const em_mat *down, float *g, float *u,
               float *d_y, int64_t ldy, em_err *err) {
    const int64_t F = gate->rows;
    const em_mat *w[] = { gate, up };
    float *const y[] = { g, u };
    const int64_t ld[] = { F, F };
    int rc = mm_many(k, a, w, y, ld, 2, err);
    return rc ? rc : mlp_down(k, g, u, F, a->n, down, d_y, ldy, err);
}

/* The routed experts of MoE layer moe_index over the n rows x (cols values; xq: their Q8_0
 * activations, or NULL) routed by ids and B.wts, into out (ld cols): on this device, or over
 * several (the same bits). */
static int routed(gk *k, int moe_index, const em_gpu_experts *xs, const float *x, int64_t cols, int n,
                  const em_gpu_act *xq, const int32_t *ids, float *out, em_err *err) {
    if (k->ep) return gk_ep_moe(k->ep, moe_index, x, cols, n, xq, ids, k->B.wts, out, cols, err);
    return em_gpu_moe_prepared(k->gpu, xs, x, cols, n, xq, ids, k->B.wts, k->hp.n_expert_used, k->B.moe, out, cols, err);
}

static em_gpu_router router_of(const kimi_hparams *hp) {
    return (em_gpu_router){ .n_expert = hp->n_expert, .k = hp->n_expert_used, .n_group = hp->n_group,
                            .n_group_used = hp->n_group_used, .norm = hp->expert_norm, .scale = hp->expert_scale };
}

static em_gpu_experts experts_of(const gk *k, const kimi_ffn_w *w) {
    const kimi_hparams *hp = &k->hp;
    return (em_gpu_experts){
        .gate = dmat(k, &w->gate_exps), .up = dmat(k, &w->up_exps), .down = dmat(k, &w->down_exps),
        .n_expert = hp->n_expert, .ffn = hp->n_ff_exp, .act = hp->situ ? EM_GPU_ACT_SITU : EM_GPU_ACT_SWIGLU,
        .situ_beta = hp->situ_beta, .situ_lin_beta = hp->situ_lin_beta,
    };
}

static int moe_layer(gk *k, int l, int moe_index, gk_acts *xa, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const kimi_ffn_w *w = &k->w.layers[l].ffn;
    const gk_layer_dev *dl = &k->ld[l];
    gk_bufs *B = &k->B;
    const int X = hp->n_expert, K = hp->n_expert_used;
    const int64_t E = hp->n_embd;
    int32_t *ids = B->ids + (int64_t)moe_index * GK_ROWS * K;
    const int n = xa->n;
    const em_gpu_router r = router_of(hp);
    const bool shared = w->gate_sh.rows > 0, latent = w->routed_down.rows > 0;
    const int64_t L = w->routed_down.rows;
    int rc = EM_OK;
    if (shared) { /* the shared expert on a branch beside the router and the routed experts (its
                   * input's Q8_0 copy made first, on the main stream, for both) */
        if ((rc = acts_ready(k, xa, &w->gate_sh, err)) || (rc = em_gpu_fork(k->gpu, 1, err)) ||
            (rc = em_gpu_branch(k->gpu, 1, err)))
            return rc;
        rc = mlp(k, xa, &w->gate_sh, &w->up_sh, &w->down_sh, B->sg, B->su, B->ys, E, err);
        int rc2 = em_gpu_branch(k->gpu, 0, err);
        if (rc || (rc = rc2)) {
            em_gpu_join(k->gpu, err);
            return em_err_prefix(err, "shared expert");
        }
    }
    /* the router alone on the main stream (a one-row F32 router loads its rows in one round
     * trip: mm_deep), with K3's latent down in the same launch */
    const em_mat *from_x[2] = { &w->router, &w->routed_down };
    float *y_x[2] = { B->logits_r, B->lx };
    const int64_t ld_x[2] = { X, L };
    rc = mm_many(k, xa, from_x, y_x, ld_x, latent ? 2 : 1, err);
    if (rc) {
        if (shared) em_gpu_join(k->gpu, err);
        return rc;
    }
    const em_gpu_experts xs = experts_of(k, w);
    rc = em_gpu_route(k->gpu, &r, B->logits_r, X, dl->router_bias, n, ids, B->wts, err);
    if (!rc && !latent) {
        rc = routed(k, moe_index, &xs, B->h, E, n, xa->have_q ? &xa->q : NULL, ids, B->y, err);
    } else if (!rc) { /* K3 latent MoE: experts at the latent width, normed, mapped back */
        gk_acts sa = acts_of(B->ls, L, L, n);
        if (!(rc = routed(k, moe_index, &xs, B->lx, L, n, NULL, ids, B->ls, err)) &&
            (!dl->routed_norm ||
             !(rc = em_gpu_rmsnorm_rows(k->gpu, B->ls, L, dl->routed_norm, hp->rms_eps, n, L, B->ls, L, err))))
            rc = mm(k, &sa, &w->routed_up, B->y, E, err);
    }
    int rc2 = shared ? em_gpu_join(k->gpu, err) : EM_OK;
    if (rc) return em_err_prefix(err, "routed experts");
    return rc2; /* the shared expert's rows (B.ys) join the routed ones in the residual step */
}

/* ---- the pass ----------------------------------------------------------------------------- */

/* A layer half's input: x itself, or (K3 AttnRes, with banks) the mix over the banks and x
 * by score vector w, for rows r0 .. r0 + n - 1 of the pass. */
static const float *res_input(gk *k, int n_bank, const float *x, const float *w, int r0, int n, em_err *err,
                              int *rc) {
    const int64_t E = k->hp.n_embd;
    *rc = EM_OK;
    if (k->hp.res_block <= 0 || n_bank == 0 || !w) return x + (int64_t)r0 * E;
    *rc = em_gpu_res_mix(k->gpu, k->B.bank + (int64_t)r0 * E, n_bank, (int64_t)GK_ROWS * E, x + (int64_t)r0 * E, E, w,
                         E, k->hp.rms_eps, n, k->B.mix, E, err);
    return k->B.mix;
}

/* The residual step still to make: x += y (+ y2). A layer's output waits here so that the
 * next norm adds it in its own launch (em_gpu_add_rmsnorm); whatever reads x first makes it
 * (flush). */
typedef struct gk_residual {
    float *y;        /* y += y2 is made in place */
    const float *y2;
} gk_residual;

static int flush(gk *k, gk_residual *r, int n, em_err *err) {
    const int64_t c = (int64_t)n * k->hp.n_embd;
    int rc = EM_OK;
    if (r->y && r->y2) rc = em_gpu_add(k->gpu, r->y, r->y2, c, r->y, err);
    if (!rc && r->y) rc = em_gpu_add(k->gpu, k->B.x, r->y, c, k->B.x, err);
    r->y = NULL, r->y2 = NULL;
    return rc;
}

/* out = RMSNorm(x += y (+ y2)) over n rows (ld n_embd; y NULL: x as it is) and its Q8_0 copy,
 * as xa: the residual step and the norm in one launch. A new layer half: the bump region of
 * activations starts over. */
static int add_norm(gk *k, float *x, const float *y, const float *y2, const float *norm_w, int n, float *out,
                    gk_acts *xa, em_err *err) {
    const int64_t E = k->hp.n_embd;
    k->P->act_used = 0;
    *xa = acts_of(out, E, E, n);
    void *q = NULL;
    int rc = E % 32 == 0 ? bump(k, em_gpu_act_bytes(EM_TYPE_Q8_0, E, n), &q, err) : EM_OK;
    if (!rc)
        rc = em_gpu_add_rmsnorm(k->gpu, x, E, y, y2, E, norm_w, k->hp.rms_eps, n, E, out, E, q, q ? &xa->q : NULL, err);
    xa->have_q = !rc && q;
    return rc;
}

/* The normed input of a layer half (or of the LM head) for pass rows r0 .. r0 + n - 1 into
 * out, and its Q8_0 copy, as xa: the residual step and the norm in one launch, or (K3 AttnRes
 * with banks) the step, the mix over the banks and x, then the norm. */
static int norm_input(gk *k, gk_residual *r, int n_bank, const float *res_w, const float *norm_w, int r0, int n,
                      float *out, gk_acts *xa, em_err *err) {
    if (k->hp.res_block > 0 && n_bank > 0 && res_w) {
        int rc = flush(k, r, n, err);
        const float *in = rc ? NULL : res_input(k, n_bank, k->B.x, res_w, r0, n, err, &rc);
        return rc ? rc : add_norm(k, (float *)in, NULL, NULL, norm_w, n, out, xa, err);
    }
    const float *y = r->y, *y2 = r->y2;
    r->y = NULL, r->y2 = NULL;
    return add_norm(k, k->B.x + (int64_t)r0 * k->hp.n_embd, y, y2, norm_w, n, out, xa, err);
}

/* Every layer over the n rows of B.tok at position *B.pos, leaving the residual rows in B.x
 * (and the features in B.feat). GK_LOGGED: KDA transitions into the logs; GK_COMMIT: folded
 * into the states too. Asynchronous; capturable. */
static int body(gk *k, int n, int mode, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const int64_t E = hp->n_embd;
    gk_bufs *B = &k->B;
    gk_residual res = { 0 };
    gk_acts xa;
    int rc = em_gpu_embed(k->gpu, dmat(k, &k->w.tok_embd), B->tok, n, B->x, E, err);
    int n_bank = 0, moe_index = 0;
    for (int l = 0; !rc && l < hp->n_layer; l++) {
        const kimi_layer *ly = &k->w.layers[l];
        const gk_layer_dev *dl = &k->ld[l];
        const bool restart = hp->res_block > 0 && l % hp->res_block == 0; /* kimi_res_push */
        if (restart && (rc = flush(k, &res, n, err))) break;
        if ((rc = norm_input(k, &res, n_bank, dl->attn_res, dl->attn_norm, 0, n, B->h, &xa, err))) break;
        if (restart && (rc = em_gpu_copy(k->gpu, B->bank + (int64_t)n_bank++ * GK_ROWS * E, B->x,
                                         (uint64_t)n * E * sizeof(float), err)))
            break;
        rc = ly->kind == KIMI_KDA ? kda_layer(k, l, &xa, mode, err) : mla_layer(k, l, &xa, err);
        if (rc) return em_err_prefix(err, "layer %d (%s)", l, ly->kind == KIMI_KDA ? "KDA" : "MLA");
        if (restart) rc = em_gpu_copy(k->gpu, B->x, B->y, (uint64_t)n * E * sizeof(float), err);
        else res.y = B->y;
        if (rc || (rc = norm_input(k, &res, n_bank, dl->ffn_res, dl->ffn_norm, 0, n, B->h, &xa, err))) break;
        if (ly->ffn.moe) {
            rc = moe_layer(k, l, moe_index++, &xa, err);
            res.y = B->y, res.y2 = ly->ffn.gate_sh.rows > 0 ? B->ys : NULL;
        } else {
            rc = mlp(k, &xa, &ly->ffn.gate, &ly->ffn.up, &ly->ffn.down, B->dg, B->du, B->y, E, err);
            res.y = B->y;
        }
        if (rc) return em_err_prefix(err, "layer %d (%s)", l, ly->ffn.moe ? "MoE" : "MLP");
        for (int f = 0; !rc && f < k->n_feature_layers; f++)
            if (k->feature_layer[f] == l && !(rc = flush(k, &res, n, err)))
                rc = em_gpu_copy_2d(k->gpu, B->feat + (int64_t)f * E, (uint64_t)k->base.info.n_feat * sizeof(float),
                                    B->x, (uint64_t)E * sizeof(float), (uint64_t)E * sizeof(float), (uint64_t)n, err);
    }
    return rc ? rc : flush(k, &res, n, err);
}

/* Final norm, LM head and argmax of pass rows r0 .. r0 + n - 1 into B.logits / B.argmax
 * (rows 0 .. n - 1 there). Asynchronous; capturable. */
static int head(gk *k, int r0, int n, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const int64_t V = hp->n_vocab;
    gk_bufs *B = &k->B;
    gk_residual none = { 0 };
    gk_acts ha;
    int rc = norm_input(k, &none, hp->res_block > 0 ? k->max_banks : 0, k->output_res, k->output_norm, r0, n, B->hh, &ha,
                        err);
    if (rc || (rc = mm(k, &ha, &k->w.output, B->logits, V, err))) return rc;
    return em_gpu_argmax_rows(k->gpu, B->logits, V, n, V, B->argmax, err);
}

/* The host side of the logs after a replayed graph: what the capture's calls set. */
static void logs_mark(gk *k, int n, bool consumed) {
    for (int i = 0; i < k->hp.n_kda; i++) {
        k->klog[i].n = n;
        k->klog[i].consumed = consumed;
    }
}

/* Runs fn through the graph *slot (captured on first use, replayed after). */
typedef int (*gk_issue)(gk *k, int a, int b, em_err *err);
static int graphed(gk *k, em_gpu_graph **slot, gk_issue fn, int a, int b, em_err *err) {
    if (k->ep) return fn(k, a, b, err); /* exchanges between devices: issued, not captured */
    if (!*slot) {
        int rc = em_gpu_capture_begin(k->gpu, err);
        if (rc) return rc;
        rc = fn(k, a, b, err);
        em_gpu_graph *gr = NULL;
        em_err e2 = { 0 };
        int rc2 = em_gpu_capture_end(k->gpu, &gr, rc ? &e2 : err);
        if (rc) {
            em_gpu_graph_free(gr);
            return rc;
        }
        if (rc2) return rc2;
        *slot = gr;
    }
    return em_gpu_graph_launch(k->gpu, *slot, err);
}

static int issue_body(gk *k, int n, int mode, em_err *err) { return body(k, n, mode, err); }
static int issue_head(gk *k, int n, int unused, em_err *err) {
    (void)unused;
    return head(k, 0, n, err);
}
static int issue_commit(gk *k, int n_keep, int unused, em_err *err) {
    (void)unused;
    return em_gpu_kda_commit_layers(k->gpu, &k->kd, k->kst, k->klog, k->hp.n_kda, n_keep, err);
}

/* Uploads the pass's tokens and first position (before any replay reads them), in one copy. */
static int pass_inputs(gk *k, const int32_t *tok, int n, int64_t pos, em_err *err) {
    int32_t in[GK_ROWS + 1] = { 0 };
    memcpy(in, tok, (size_t)n * sizeof *tok);
    in[GK_ROWS] = (int32_t)pos;
    return em_gpu_upload(k->gpu, k->B.tok, in, sizeof in, err);
}

/* ---- results ------------------------------------------------------------------------------- */

static bool want_logits(const em_rows *o, int r, int n) {
    if (!o || !o->logits) return false;
    return o->last_only ? r == n - 1 : !o->logit_rows || o->logit_rows[r];
}
static bool want_argmax(const em_rows *o, int r, int n) {
    if (!o || !o->argmax) return false;
    return o->last_only ? r == n - 1 : !o->argmax_rows || o->argmax_rows[r];
}

/* Copies what o asks for of pass rows 0 .. m - 1, which are request rows r0 .. r0 + m - 1 of
 * n; the head ran over pass rows h0 .. m - 1 (h0 > 0: only the last rows were wanted). */
static int download_rows(gk *k, const em_rows *o, int r0, int m, int n, int h0, em_err *err) {
    const int64_t V = k->hp.n_vocab;
    const em_target_info *info = &k->base.info;
    int rc = EM_OK, lo = -1, hi = -1;
    bool any_argmax = false;
    for (int j = h0; j < m; j++) {
        if (want_logits(o, r0 + j, n)) {
            if (lo < 0) lo = j;
            hi = j;
        }
        any_argmax |= want_argmax(o, r0 + j, n);
    }
    if (any_argmax) {
        int32_t am[GK_ROWS];
        if ((rc = em_gpu_download(k->gpu, am, k->B.argmax, (size_t)(m - h0) * sizeof *am, err))) return rc;
        for (int j = h0; j < m; j++)
            if (want_argmax(o, r0 + j, n)) o->argmax[o->last_only ? 0 : r0 + j] = am[j - h0];
    }
    /* then the features and routes too: a sampling loop asks for logits and features */
    if (lo >= 0 && o->last_only) {
        rc = em_gpu_download(k->gpu, o->logits, k->B.logits + (int64_t)(lo - h0) * V, (size_t)V * sizeof(float), err);
    } else if (lo >= 0 && (hi == lo || !o->logit_rows)) { /* one run straight into the caller's rows */
        rc = em_gpu_download(k->gpu, o->logits + (int64_t)(r0 + lo) * V, k->B.logits + (int64_t)(lo - h0) * V,
                             (size_t)(hi - lo + 1) * (size_t)V * sizeof(float), err);
    } else if (lo >= 0) {
        for (int j = lo; j <= hi && !rc; j++)
            if (want_logits(o, r0 + j, n))
                rc = em_gpu_download(k->gpu, o->logits + (int64_t)(r0 + j) * V, k->B.logits + (int64_t)(j - h0) * V,
                                     (size_t)V * sizeof(float), err);
    }
    if (!rc && o && o->features)
        rc = em_gpu_download(k->gpu, o->features + (int64_t)r0 * info->n_feat, k->B.feat,
                             (size_t)m * (size_t)info->n_feat * sizeof(float), err);
    if (!rc && o && o->device_features) /* stream-ordered: no host sync for these */
        rc = em_gpu_copy(k->gpu, k->B.feat_out + (int64_t)r0 * info->n_feat, k->B.feat,
                         (uint64_t)m * (uint64_t)info->n_feat * sizeof(float), err);
    if (!rc && o && o->routes) {
        const int K = k->hp.n_expert_used;
        if ((rc = em_gpu_download(k->gpu, k->h_ids, k->B.ids, (size_t)k->n_moe * GK_ROWS * K * sizeof(int32_t), err)))
            return rc;
        for (int j = 0; j < m; j++)
            for (int i = 0; i < k->n_moe; i++)
                memcpy(o->routes + (int64_t)(r0 + j) * info->n_route + (int64_t)i * K,
                       k->h_ids + ((int64_t)i * GK_ROWS + j) * K, (size_t)K * sizeof(int32_t));
    }
    return rc;
}

/* Which pass rows 0 .. m - 1 (request rows r0 ..) need the LM head: from the first wanted one
 * (-1: none). */
static int head_from(const em_rows *o, int r0, int m, int n) {
    for (int j = 0; j < m; j++)
        if (want_logits(o, r0 + j, n) || want_argmax(o, r0 + j, n)) return j;
    return -1;
}

/* One committing pass of m rows at the target's position: prefill chunks and replays. */
static int commit_pass(gk *k, const int32_t *tok, int m, const em_rows *o, int r0, int n, em_err *err) {
    int rc = pass_inputs(k, tok, m, k->base.pos, err);
    if (!rc) rc = graphed(k, &k->g_body[GK_COMMIT][m], issue_body, m, GK_COMMIT, err);
    if (rc) return rc;
    logs_mark(k, m, true);
    const int h0 = head_from(o, r0, m, n);
    if (h0 >= 0 && (rc = head(k, h0, m - h0, err))) return rc;
    if (o && (h0 >= 0 || o->features || o->device_features || o->routes))
        rc = download_rows(k, o, r0, m, n, h0 < 0 ? m : h0, err);
    else rc = em_gpu_sync(k->gpu, err);
    if (!rc) k->base.pos += m;
    return rc;
}

static int run_commit(gk *k, const int32_t *tok, int n, const em_rows *o, em_err *err) {
    for (int r0 = 0; r0 < n; r0 += GK_ROWS) {
        const int m = n - r0 < GK_ROWS ? n - r0 : GK_ROWS;
        int rc = commit_pass(k, tok + r0, m, o, r0, n, err);
        if (rc) return rc;
    }
    return EM_OK;
}

/* ---- wide prefill passes --------------------------------------------------------------------
 * A pass of GK_ROWS rows reads every weight once for its rows: every dense matrix, and on a
 * 48B-shaped model (256 experts, top-8) about 100 routed experts a layer for each 16 rows of a
 * prompt. A wide pass takes up to GK_WIDE rows through each layer on its own buffers (W.b):
 * the norms, the products (Q8_0 on the tensor cores, em_gpu_matmul) and the routed experts
 * (em_gpu_moe_wide: each expert once per pass), the KDA recurrence (one call on the wide log
 * W.log) and MLA's per-head products over all its rows; MLA's cache and attention in chunks of
 * GK_ROWS. Each row gets the narrow passes' arithmetic, so states and outputs are
 * bit-identical to narrow passes' (tests/cuda/test_gpu_target.c). A full pass (GK_WIDE rows)
 * is captured once and replayed: its positions are read on the device and its launch shapes are
 * fixed. Kimi-Linear layers on one device (no AttnRes banks, no latent MoE). */

/* Whether a prefill of n rows asking o runs wide passes (the model's side: wide_setup). */
static bool wide_ok(const gk *k, const em_rows *o, int n) {
    return k->wide && n >= k->wide && !k->W.failed && !(o && o->routes);
}

/* The wide buffers, at the first wide pass; on failure (device memory) narrow passes only. */
static int wide_alloc(gk *k) {
    if (k->W.mem) return EM_OK;
    carver c = { 0 };
    carve_bufs(k, &c, &k->W.b, GK_WIDE, true);
    const uint64_t log_at = c.at, log_bytes = k->hp.n_kda ? em_gpu_kda_log_bytes(&k->kd, GK_WIDE) : 0;
    c.at += align256(log_bytes);
    em_err e = { 0 };
    int rc = em_gpu_alloc(k->gpu, c.at, "wide prefill buffers", &k->W.mem, &e);
    if (!rc && log_bytes) rc = em_gpu_kda_log_init(&k->kd, GK_WIDE, (uint8_t *)k->W.mem + log_at, &k->W.log, &e);
    if (rc) {
        em_log(EM_LOG_INFO, "%s: prefill in passes of %d rows (%s)", k->device, GK_ROWS, e.msg);
        em_gpu_free(k->gpu, k->W.mem);
        k->W.mem = NULL;
        k->W.failed = true;
        return EM_ENOMEM;
    }
    c = (carver){ .base = k->W.mem };
    carve_bufs(k, &c, &k->W.b, GK_WIDE, true);
    return EM_OK;
}

/* The FFN of MoE layer l over the wide pass's rows (xa): the shared expert, the router and
 * its routes (moe_layer's calls), every row's routed experts in one call, then y += ys. */
static int wide_moe(gk *k, int l, gk_acts *xa, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const kimi_ffn_w *w = &k->w.layers[l].ffn;
    gk_bufs *B = k->P;
    const int64_t E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;
    const bool shared = w->gate_sh.rows > 0;
    int rc = shared ? mlp(k, xa, &w->gate_sh, &w->up_sh, &w->down_sh, B->sg, B->su, B->ys, E, err) : EM_OK;
    const em_mat *router[1] = { &w->router };
    float *logits[1] = { B->logits_r };
    if (!rc) rc = mm_many(k, xa, router, logits, &X, 1, err); /* as moe_layer launches it */
    const em_gpu_router rt = router_of(hp);
    if (!rc) rc = em_gpu_route(k->gpu, &rt, B->logits_r, X, k->ld[l].router_bias, xa->n, B->ids, B->wts, err);
    const em_gpu_experts xs = experts_of(k, w);
    if (!rc) rc = em_gpu_moe_wide(k->gpu, &xs, B->h, E, xa->n, B->ids, B->wts, (int)K, B->moe, B->y, E, err);
    if (!rc && shared) rc = em_gpu_add(k->gpu, B->y, B->ys, (int64_t)xa->n * E, B->y, err); /* flush()'s order */
    return rc;
}

/* Every layer over the m rows of k->P (the wide buffers; m <= GK_WIDE), committing, leaving the
 * residual rows in x and the features in feat. Asynchronous. */
static int wide_body(gk *k, int m, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const int64_t E = hp->n_embd, all = (int64_t)m * E;
    const uint64_t nf = (uint64_t)k->base.info.n_feat;
    gk_bufs *B = k->P;
    em_gpu *g = k->gpu;
    gk_acts xa;
    int rc = EM_OK;
    for (int r = 0; r < m && !rc; r += GK_ROWS)
        rc = em_gpu_embed(g, dmat(k, &k->w.tok_embd), B->tok + r / GK_ROWS * (GK_ROWS + 1),
                          m - r < GK_ROWS ? m - r : GK_ROWS, B->x + r * E, E, err);
    for (int l = 0; !rc && l < hp->n_layer; l++) {
        const kimi_layer *ly = &k->w.layers[l];
        const gk_layer_dev *dl = &k->ld[l];
        if ((rc = add_norm(k, B->x, NULL, NULL, dl->attn_norm, m, B->h, &xa, err))) break;
        rc = ly->kind == KIMI_KDA ? kda_layer(k, l, &xa, GK_COMMIT, err) : mla_layer(k, l, &xa, err);
        if (!rc) rc = add_norm(k, B->x, B->y, NULL, dl->ffn_norm, m, B->h, &xa, err);
        if (!rc && ly->ffn.moe) rc = wide_moe(k, l, &xa, err);
        else if (!rc) rc = mlp(k, &xa, &ly->ffn.gate, &ly->ffn.up, &ly->ffn.down, B->dg, B->du, B->y, E, err);
        if (!rc) rc = em_gpu_add(g, B->x, B->y, all, B->x, err); /* flush()'s order: (y + ys), then x + that */
        for (int f = 0; !rc && f < k->n_feature_layers; f++)
            if (k->feature_layer[f] == l)
                rc = em_gpu_copy_2d(g, B->feat + (int64_t)f * E, nf * sizeof(float), B->x, (uint64_t)E * sizeof(float),
                                    (uint64_t)E * sizeof(float), (uint64_t)m, err);
        if (rc) return em_err_prefix(err, "layer %d (%s) of a wide pass of %d rows", l,
                                     ly->kind == KIMI_KDA ? "KDA" : "MLA", m);
    }
    return rc;
}

static int issue_wide(gk *k, int m, int unused, em_err *err) {
    (void)unused;
    return wide_body(k, m, err);
}

/* One wide committing pass of m rows at the target's position (request rows r0.. of n): the
 * chunks' inputs in one upload, the layers (a full pass's captured once and replayed: the
 * positions are read on the device; its about 1,400 launches, issued one by one, left the GPU
 * waiting between them), then per chunk what o asks (commit_pass's head and downloads, on the
 * chunk's rows copied into B). */
static int wide_pass(gk *k, const int32_t *tok, int m, const em_rows *o, int r0, int n, em_err *err) {
    const int64_t E = k->hp.n_embd, nf = k->base.info.n_feat;
    const int nc = (m + GK_ROWS - 1) / GK_ROWS;
    gk_bufs *W = &k->W.b;
    int32_t in[GK_WIDE / GK_ROWS * (GK_ROWS + 1)] = { 0 };
    for (int c = 0; c < nc; c++) {
        const int r = c * GK_ROWS, mc = m - r < GK_ROWS ? m - r : GK_ROWS;
        memcpy(in + c * (GK_ROWS + 1), tok + r, (size_t)mc * sizeof *tok);
        in[c * (GK_ROWS + 1) + GK_ROWS] = (int32_t)(k->base.pos + r);
    }
    int rc = em_gpu_upload(k->gpu, W->tok, in, (uint64_t)nc * (GK_ROWS + 1) * sizeof *in, err);
    k->P = W;
    if (!rc) rc = m == GK_WIDE ? graphed(k, &k->g_wide, issue_wide, m, 0, err) : wide_body(k, m, err);
    k->P = &k->B;
    const bool feats = o && (o->features || o->device_features);
    for (int c = 0; !rc && c < nc; c++) {
        const int r = c * GK_ROWS, mc = m - r < GK_ROWS ? m - r : GK_ROWS;
        const int h0 = head_from(o, r0 + r, mc, n);
        if (h0 < 0 && !feats) continue;
        if (h0 >= 0 && !(rc = em_gpu_copy(k->gpu, k->B.x, W->x + r * E, (uint64_t)mc * E * sizeof(float), err)))
            rc = head(k, h0, mc - h0, err);
        if (!rc && feats)
            rc = em_gpu_copy(k->gpu, k->B.feat, W->feat + r * nf, (uint64_t)mc * nf * sizeof(float), err);
        if (!rc) rc = download_rows(k, o, r0 + r, mc, n, h0 < 0 ? mc : h0, err);
    }
    if (!rc) rc = em_gpu_sync(k->gpu, err);
    if (rc) return rc;
    logs_mark(k, m - (nc - 1) * GK_ROWS, true);
    k->base.pos += m;
    return EM_OK;
}

/* A prefill's rows: wide passes, then the rows short of one in narrow passes. */
static int run_wide(gk *k, const int32_t *tok, int n, const em_rows *o, em_err *err) {
    int r0 = 0, rc = EM_OK;
    for (; !rc && n - r0 >= k->wide; r0 += GK_WIDE)
        rc = wide_pass(k, tok + r0, n - r0 < GK_WIDE ? n - r0 : GK_WIDE, o, r0, n, err);
    for (; !rc && r0 < n; r0 += GK_ROWS)
        rc = commit_pass(k, tok + r0, n - r0 < GK_ROWS ? n - r0 : GK_ROWS, o, r0, n, err);
    return rc;
}

/* ---- cost model ------------------------------------------------------------------------------ */

/* Dense products of n rows against one row, measured on big Q8_0 matrices (docs/cuda.md run 2). */
static double width_factor(int n) {
    return n <= 1 ? 1.0 : n <= 2 ? 1.05 : n <= 4 ? 1.12 : n <= 8 ? 1.44 : n <= 16 ? 3.2 : 3.2 * n / 16.0;
}

/* Weight bytes a pass of n rows streams: every dense matrix once, the expected union of the
 * rows' routes per MoE layer. */
static double pass_weight_bytes(const gk *k, int n) {
    const kimi_hparams *hp = &k->hp;
    double experts = 0.0;
    if (k->n_moe > 0) { /* the expected union of n rows' routes, per MoE layer */
        double p_miss = 1.0 - (double)hp->n_expert_used / hp->n_expert;
        experts = hp->n_expert * (1.0 - pow(p_miss, n));
    }
    return (double)k->dense_bytes + experts * k->n_moe * (double)k->expert_bytes;
}

static double nominal_cost(const gk *k, int n, int64_t pos) {
    const kimi_hparams *hp = &k->hp;
    const double cache = (double)(pos + n) * (hp->kv_lora + hp->rope) * sizeof(float) * hp->n_mla;
    const double state = 2.0 * (double)k->state_bytes;
    const double bytes = pass_weight_bytes(k, n) + (double)k->dense_bytes * (width_factor(n) - 1.0) + cache + state;
    const double kernels = 12.0 * hp->n_layer + 8.0; /* about what a pass launches */
    return bytes / GK_NOMINAL_BPS + kernels * GK_NOMINAL_KERNEL_S;
}

static em_cost gk_cost(const em_target *t, int n) {
    const gk *k = (const gk *)t;
    const double nominal = nominal_cost(k, n, t->pos);
    return (em_cost){ .seconds = nominal * k->cost_scale, .bytes_read = 0, .nominal_seconds = nominal,
                      .weight_bytes = (uint64_t)pass_weight_bytes(k, n) };
}

static void cost_learn(gk *k, int n, int64_t pos, double seconds) {
    const double est = nominal_cost(k, n, pos);
    if (est > 0 && seconds > 0) k->cost_scale = 0.8 * k->cost_scale + 0.2 * (seconds / est);
}

/* ---- target ops -------------------------------------------------------------------------------- */

static void gk_reset(em_target *t) {
    gk *k = (gk *)t;
    em_err e = { 0 };
    if (k->state_mem && em_gpu_memset(k->gpu, k->state_mem, 0, k->state_bytes, &e))
        em_log(EM_LOG_ERROR, "%s: resetting the KDA states failed: %s", k->device, e.msg);
    logs_mark(k, 0, true);
    t->pos = 0;
    t->pending = -1;
    k->replay = false;
}

/* A verify wider than the logs: the KDA states are saved, the rows run in committing passes,
 * and the states are put back; commit then replays the accepted tokens. */
static int wide_verify(gk *k, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    em_target *t = &k->base;
    const int64_t pos0 = t->pos;
    int rc = k->state_bytes ? em_gpu_copy(k->gpu, k->backup_mem, k->state_mem, k->state_bytes, err) : EM_OK;
    if (!rc) rc = run_commit(k, tok, n, out, err);
    t->pos = pos0;
    int rc2 = k->state_bytes ? em_gpu_copy(k->gpu, k->state_mem, k->backup_mem, k->state_bytes, err) : EM_OK;
    if (!rc && rc2) rc = rc2;
    if (!rc) rc = em_gpu_sync(k->gpu, err);
    logs_mark(k, 0, true);
    if (!rc) memcpy(k->replay_tok, tok, (size_t)n * sizeof *tok);
    return rc;
}

/* What the CUDA target does not report yet. */
static int rows_supported(const gk *k, const em_rows *out, int n, em_err *err) {
    if (out && out->device_features && (out->features || n > GK_FEATURE_ROWS)) /* target.c checked the rest */
        return em_err_set(err, EM_EINVAL, "%s: %d rows of features kept on the device (at most %d, and not together "
                          "with features copied out)", k->device, n, GK_FEATURE_ROWS);
    if (!out || !out->route_margins) return EM_OK;
    return em_err_set(err, EM_EUNSUPPORTED, "%s: route margins are not reported on the GPU yet (the CPU target has them)",
                      k->device);
}

static int gk_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    gk *k = (gk *)t;
    const double t0 = em_time_now();
    int rc = rows_supported(k, out, n, err);
    if (rc) return rc;
    t->pending = -1;
    const bool logged = n <= t->info.max_verify;
    if (!logged) {
        rc = wide_verify(k, tok, n, out, err);
    } else {
        rc = pass_inputs(k, tok, n, t->pos, err);
        if (!rc) rc = graphed(k, &k->g_body[GK_LOGGED][n], issue_body, n, GK_LOGGED, err);
        if (!rc) logs_mark(k, n, false);
        const int h0 = head_from(out, 0, n, n);
        if (!rc && h0 >= 0) rc = h0 == 0 ? graphed(k, &k->g_head[n], issue_head, n, 0, err) : head(k, h0, n - h0, err);
        if (!rc && (h0 >= 0 || out->features || out->device_features || out->routes))
            rc = download_rows(k, out, 0, n, n, h0 < 0 ? n : h0, err);
        else if (!rc) rc = em_gpu_sync(k->gpu, err);
    }
    if (rc) {
        logs_mark(k, 0, true);
        return em_err_prefix(err, "%s: verify of %d rows at position %lld", k->device, n, (long long)t->pos);
    }
    cost_learn(k, n, t->pos, em_time_now() - t0);
    k->replay = !logged;
    t->pending = n;
    t->stats.verifies++;
    t->stats.rows_verified += (uint64_t)n;
    return EM_OK;
}

static int gk_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    gk *k = (gk *)t;
    int rc = rows_supported(k, out, n, err);
    if (rc) return rc;
    t->pending = -1;
    const int64_t pos0 = t->pos;
    rc = wide_ok(k, out, n) && !wide_alloc(k) ? run_wide(k, tok, n, out, err) : run_commit(k, tok, n, out, err);
    if (rc) {
        em_err_prefix(err, "%s: prefill of %d rows at position %lld (sequence reset)", k->device, n, (long long)pos0);
        gk_reset(t);
        return rc;
    }
    t->stats.prefills++;
    t->stats.rows_prefilled += (uint64_t)n;
    return EM_OK;
}

static int gk_commit(em_target *t, int n_keep, em_err *err) {
    gk *k = (gk *)t;
    int rc = EM_OK;
    if (k->replay) {
        t->stats.full_replays++;
        rc = run_commit(k, k->replay_tok, n_keep, NULL, err);
        if (rc) {
            t->stats.failed_fallbacks++;
            em_err_prefix(err, "%s: commit of %d rows by replay (sequence reset)", k->device, n_keep);
            gk_reset(t);
            return rc;
        }
    } else {
        if (n_keep > 0 && k->hp.n_kda > 0) rc = graphed(k, &k->g_commit[n_keep], issue_commit, n_keep, 0, err);
        if (rc) {
            em_err_prefix(err, "%s: commit of %d rows (sequence reset)", k->device, n_keep);
            gk_reset(t);
            return rc;
        }
        logs_mark(k, 0, true);
        t->pos += n_keep;
        t->stats.fast_commits++;
    }
    t->pending = -1;
    k->replay = false;
    return EM_OK;
}

static void free_graphs(gk *k) {
    for (int i = 0; i <= GK_ROWS; i++) {
        em_gpu_graph_free(k->g_body[0][i]);
        em_gpu_graph_free(k->g_body[1][i]);
        em_gpu_graph_free(k->g_head[i]);
        em_gpu_graph_free(k->g_commit[i]);
    }
    em_gpu_graph_free(k->g_wide);
}

static void gk_close(em_target *t) {
    gk *k = (gk *)t;
    free_graphs(k);
    gk_ep_close(k->ep);
    for (int i = 0; i < k->tab.n; i++) {
        if (k->tab.w[i].is_vec) em_gpu_free(k->gpu, k->tab.w[i].dv);
        else em_gpu_mat_free(k->gpu, &k->tab.w[i].dm);
    }
    em_gpu_free(k->gpu, k->state_mem);
    em_gpu_free(k->gpu, k->backup_mem);
    em_gpu_free(k->gpu, k->log_mem);
    em_gpu_free(k->gpu, k->cache_mem);
    em_gpu_free(k->gpu, k->buf_mem);
    em_gpu_free(k->gpu, k->W.mem);
    em_gpu_close(k->gpu);
    free(k->tab.w);
    free(k->tab.slot);
    free(k->ld);
    free(k->kst);
    free(k->klog);
    free(k->cache);
    free(k->replay_tok);
    free(k->h_ids);
    kimi_unload(&k->hp, &k->w);
    em_gguf_close(k->g);
    free(k);
}

static int gk_shared_weights(const em_target *t, em_target_shared *out, em_err *err) {
    (void)err;
    const gk *k = (const gk *)t;
    *out = (em_target_shared){ .path = em_gguf_path(k->g), .arch = t->info.arch, .n_embd = k->hp.n_embd,
                               .n_layer = k->hp.n_layer, .n_vocab = k->hp.n_vocab, .token_embd = &k->w.tok_embd,
                               .output = &k->w.output, .cuda_index = em_gpu_get_info(k->gpu)->index,
                               .d_token_embd = dmat(k, &k->w.tok_embd), .d_output = dmat(k, &k->w.output),
                               .gpu = k->gpu, .d_features = t->info.n_feat ? k->B.feat_out : NULL,
                               .feature_rows = t->info.n_feat ? GK_FEATURE_ROWS : 0 };
    return EM_OK;
}

static const em_target_ops gk_ops = {
    .verify = gk_verify,
    .commit = gk_commit,
    .prefill = gk_prefill,
    .cost = gk_cost,
    .reset = gk_reset,
    .close = gk_close,
    .shared_weights = gk_shared_weights,
};

/* ---- open ------------------------------------------------------------------------------------ */

static uint64_t weight_bytes(const gk *k, int i, em_err *err, int *rc) {
    const gk_weight *w = &k->tab.w[i];
    uint64_t b = 0;
    *rc = EM_OK;
    if (w->is_vec) return align256((uint64_t)w->n * sizeof(float));
    if ((*rc = em_gpu_mat_bytes(w->m.type, w->m.rows, w->m.cols, &b, err))) em_err_prefix(err, "%s", w->name);
    return align256(b) + 256; /* data and scales round up separately */
}

static uint64_t state_sizes(gk *k, uint64_t *log_bytes, uint64_t *cache_bytes) {
    const kimi_hparams *hp = &k->hp;
    const uint64_t st = hp->n_kda ? em_gpu_kda_state_floats(&k->kd) * sizeof(float) : 0;
    k->state_bytes = st * (uint64_t)hp->n_kda;
    *log_bytes = hp->n_kda ? align256(em_gpu_kda_log_bytes(&k->kd, GK_ROWS)) * (uint64_t)hp->n_kda : 0;
    *cache_bytes = (uint64_t)k->md.capacity * ((uint64_t)hp->kv_lora + (uint64_t)hp->rope) * sizeof(float);
    *cache_bytes = align256(*cache_bytes) * (uint64_t)hp->n_mla;
    return 2 * k->state_bytes + *log_bytes + *cache_bytes;
}

/* Refuses a model the device cannot hold, naming both sizes, before anything is uploaded. */
static int fit_check(gk *k, uint64_t weights, uint64_t state, uint64_t bufs, em_err *err) {
    uint64_t free_b = 0, total = 0;
    int rc = em_gpu_mem(k->gpu, &free_b, &total, err);
    if (rc) return rc;
    const uint64_t need = weights + state + bufs + GK_MARGIN_BYTES;
    if (need <= free_b) return EM_OK;
    char a[32], b[32], c[32], d[32], e[32], f[32], t[32];
    return em_err_set(err, EM_ENOMEM,
                      "%s: the model needs %s of device memory (weights %s, sequence state %s, buffers %s, margin %s); "
                      "%s has %s free (of %s)",
                      em_gguf_path(k->g), em_format_size(need, a, sizeof a), em_format_size(weights, b, sizeof b),
                      em_format_size(state, c, sizeof c), em_format_size(bufs, d, sizeof d),
                      em_format_size(GK_MARGIN_BYTES, e, sizeof e), k->device, em_format_size(free_b, f, sizeof f),
                      em_format_size(total, t, sizeof t));
}

static void progress(const gk *k, bool tty, uint64_t done, uint64_t total, int i, int n) {
    if (!tty) return;
    char a[32], b[32];
    fprintf(stderr, "\r%s: uploading weights %s of %s (%d of %d tensors)   ", k->device, em_format_size(done, a, sizeof a),
            em_format_size(total, b, sizeof b), i, n);
    if (i == n) fputc('\n', stderr);
}

static int upload_weights(gk *k, uint64_t total, em_err *err) {
    const bool tty = isatty(STDERR_FILENO);
    uint64_t done = 0;
    double last = 0.0;
    int rc = EM_OK;
    for (int i = 0; i < k->tab.n && !rc; i++) {
        gk_weight *w = &k->tab.w[i];
        if (table_find(&k->tab, w->key) != w || w->expert_stack) continue; /* listed twice; placed by k->ep */
        if (w->is_vec) {
            void *d;
            if (!(rc = em_gpu_alloc(k->gpu, (uint64_t)w->n * sizeof(float), w->name, &d, err))) {
                w->dv = d;
                rc = em_gpu_upload(k->gpu, d, w->key, (uint64_t)w->n * sizeof(float), err);
            }
        } else if (!w->m.data) {
            rc = em_err_set(err, EM_EFORMAT, "%s: tensor '%s' has no data in the file (cut short): nothing to upload",
                            em_gguf_path(k->g), w->name);
        } else {
            rc = em_gpu_mat_upload(k->gpu, w->m.type, w->m.rows, w->m.cols, w->m.data, w->name, &w->dm, err);
        }
        done += w->is_vec ? (uint64_t)w->n * sizeof(float) : w->dm.bytes;
        if (em_time_now() - last > 0.25 || i + 1 == k->tab.n) {
            progress(k, tty, done, total, i + 1, k->tab.n);
            last = em_time_now();
        }
    }
    if (rc && tty) fputc('\n', stderr);
    return rc ? em_err_prefix(err, "%s", k->device) : EM_OK;
}

static int layer_vectors(gk *k, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    k->ld = calloc((size_t)hp->n_layer, sizeof *k->ld);
    if (!k->ld) return em_err_set(err, EM_ENOMEM, "out of memory for the GPU layer table");
    for (int l = 0; l < hp->n_layer; l++) {
        const kimi_layer *ly = &k->w.layers[l];
        gk_layer_dev *d = &k->ld[l];
        d->attn_norm = dvec(k, ly->attn_norm), d->ffn_norm = dvec(k, ly->ffn_norm);
        d->attn_res = dvec(k, ly->attn_res), d->ffn_res = dvec(k, ly->ffn_res);
        d->kda = (em_gpu_kda_params){ .conv_q = dvec(k, ly->kda.p.conv_q), .conv_k = dvec(k, ly->kda.p.conv_k),
                                      .conv_v = dvec(k, ly->kda.p.conv_v), .ssm_a = dvec(k, ly->kda.p.ssm_a),
                                      .dt_bias = dvec(k, ly->kda.p.dt_bias), .o_norm = dvec(k, ly->kda.p.o_norm) };
        d->q_a_norm = dvec(k, ly->mla.q_a_norm), d->kv_a_norm = dvec(k, ly->mla.kv_a_norm);
        d->router_bias = dvec(k, ly->ffn.router_bias), d->routed_norm = dvec(k, ly->ffn.routed_norm);
        if (!d->attn_norm || !d->ffn_norm || (ly->attn_res && !d->attn_res) || (ly->ffn_res && !d->ffn_res) ||
            (ly->kind == KIMI_KDA && (!d->kda.conv_q || !d->kda.ssm_a || !d->kda.dt_bias || !d->kda.o_norm)) ||
            (ly->kind == KIMI_MLA && (!d->kv_a_norm || (hp->q_lora && !d->q_a_norm))) ||
            (ly->ffn.moe && !d->router_bias) || (ly->ffn.routed_norm && !d->routed_norm))
            return em_err_set(err, EM_EINVAL, "GPU target: a vector of layer %d was not uploaded", l);
    }
    k->output_norm = dvec(k, k->w.output_norm);
    k->output_res = dvec(k, k->w.output_res);
    if (!k->output_norm || (k->w.output_res && !k->output_res) || !dmat(k, &k->w.output) || !dmat(k, &k->w.tok_embd))
        return em_err_set(err, EM_EINVAL, "GPU target: the output norm, LM head or embedding was not uploaded");
    return EM_OK;
}

/* The KDA states, logs and MLA caches on the device (sizes from state_sizes). */
static int make_state(gk *k, uint64_t log_bytes, uint64_t cache_bytes, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    k->kst = calloc((size_t)hp->n_kda + 1, sizeof *k->kst);
    k->klog = calloc((size_t)hp->n_kda + 1, sizeof *k->klog);
    k->cache = calloc((size_t)hp->n_mla + 1, sizeof *k->cache);
    if (!k->kst || !k->klog || !k->cache) return em_err_set(err, EM_ENOMEM, "out of memory for the GPU state table");
    int rc;
    if (hp->n_kda) {
        if ((rc = em_gpu_alloc(k->gpu, k->state_bytes, "KDA states", &k->state_mem, err)) ||
            (rc = em_gpu_alloc(k->gpu, k->state_bytes, "KDA state snapshot", &k->backup_mem, err)) ||
            (rc = em_gpu_alloc(k->gpu, log_bytes, "KDA transition logs", &k->log_mem, err)))
            return rc;
        const uint64_t st = em_gpu_kda_state_floats(&k->kd), conv = 3ull * (uint64_t)(hp->d_conv - 1) * hp->d_inner;
        const uint64_t lb = log_bytes / (uint64_t)hp->n_kda;
        for (int i = 0; i < hp->n_kda; i++) {
            float *s = (float *)k->state_mem + (uint64_t)i * st;
            k->kst[i] = (em_gpu_kda_state){ .conv = s, .S = s + conv };
            if ((rc = em_gpu_kda_log_init(&k->kd, GK_ROWS, (uint8_t *)k->log_mem + (uint64_t)i * lb, &k->klog[i], err)))
                return rc;
        }
    }
    if (hp->n_mla) {
        if ((rc = em_gpu_alloc(k->gpu, cache_bytes, "MLA latent caches", &k->cache_mem, err))) return rc;
        for (int i = 0; i < hp->n_mla; i++) k->cache[i] = (float *)((uint8_t *)k->cache_mem + (uint64_t)i * (cache_bytes / (uint64_t)hp->n_mla));
    }
    return EM_OK;
}

static void cost_setup(gk *k) {
    uint64_t dense = 0, experts = 0;
    for (int l = 0; l < k->hp.n_layer; l++) {
        const kimi_ffn_w *f = &k->w.layers[l].ffn;
        if (f->moe) experts += f->gate_exps.row_bytes * (uint64_t)f->gate_exps.rows + f->up_exps.row_bytes * (uint64_t)f->up_exps.rows +
                               f->down_exps.row_bytes * (uint64_t)f->down_exps.rows;
    }
    for (int i = 0; i < k->tab.n; i++)
        if (!k->tab.w[i].is_vec) dense += k->tab.w[i].m.row_bytes * (uint64_t)k->tab.w[i].m.rows;
    dense -= experts < dense ? experts : dense;
    dense -= k->w.tok_embd.row_bytes * (uint64_t)k->w.tok_embd.rows; /* gathered, not streamed */
    k->dense_bytes = dense;
    k->expert_bytes = k->n_moe && k->hp.n_expert ? experts / ((uint64_t)k->n_moe * (uint64_t)k->hp.n_expert) : 0;
    k->cost_scale = 1.0;
}

/* Prefills from how many rows on take wide passes: 32 where routed experts are most of what a
 * pass reads (a layer's stack of 64 MiB or more), else never (small models: graphs of narrow
 * passes are faster); EMBER_GPU_WIDE=N sets N (0: never). Never for what wide passes do not
 * run: no routed experts, K3's AttnRes banks or latent MoE, experts over several devices. */
static void wide_setup(gk *k) {
    const char *env = getenv("EMBER_GPU_WIDE");
    k->wide = env ? atoi(env) : k->expert_bytes * (uint64_t)k->hp.n_expert >= (64ull << 20) ? 2 * GK_ROWS : 0;
    bool latent = false;
    for (int l = 0; l < k->hp.n_layer; l++) latent |= k->w.layers[l].ffn.routed_down.rows > 0;
    if (k->wide < 0 || k->n_moe == 0 || k->hp.res_block > 0 || latent || k->ep) k->wide = 0;
}

static int set_info(gk *k, const em_model_opts *opts, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    const char *path = em_gguf_path(k->g);
    int64_t n_ctx = opts->n_ctx;
    if (n_ctx == 0) n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < EM_MODEL_DEFAULT_CTX ? hp->n_ctx_train : EM_MODEL_DEFAULT_CTX;
    for (int l = 0; l < hp->n_layer; l++) k->n_moe += k->w.layers[l].ffn.moe;
    k->base.info = (em_target_info){
        .arch = hp->k3 ? "kimi-k3" : "kimi-linear", .device = k->device, .n_vocab = hp->n_vocab, .n_embd = hp->n_embd,
        .n_layer = hp->n_layer, .n_ctx = (int)n_ctx, .n_feat = opts->n_feature_layers * hp->n_embd,
        .max_verify = opts->max_verify < GK_ROWS ? opts->max_verify : GK_ROWS, .n_moe_layers = k->n_moe,
        .n_route = k->n_moe * hp->n_expert_used,
    };
    if (k->base.info.max_verify > n_ctx) k->base.info.max_verify = (int)n_ctx;
    for (int i = 0; i < opts->n_feature_layers; i++) {
        if (opts->feature_layers[i] < 0 || opts->feature_layers[i] >= hp->n_layer)
            return em_err_set(err, EM_EINVAL, "%s: feature layer %d is not a layer of this model (0..%d)", path,
                              opts->feature_layers[i], hp->n_layer - 1);
        k->feature_layer[i] = opts->feature_layers[i];
    }
    k->n_feature_layers = opts->n_feature_layers;
    k->max_banks = hp->res_block > 0 ? (hp->n_layer + hp->res_block - 1) / hp->res_block : 0;
    k->kd = (em_gpu_kda_dims){ .n_head = hp->kda_heads, .head_dim = hp->kda_head_dim, .d_conv = hp->d_conv,
                               .norm_eps = hp->rms_eps, .l2_eps = KIMI_L2_EPS, .bounded_gate = hp->gate_bounded,
                               .gate_lower_bound = hp->gate_lb };
    k->md = (em_gpu_mla_dims){ .n_head = hp->mla_heads, .kv_lora = hp->kv_lora, .rope = hp->rope, .nope = hp->nope,
                               .capacity = n_ctx };
    int rc = hp->n_kda ? em_gpu_kda_dims_check(&k->kd, err) : EM_OK;
    if (rc) return em_err_prefix(err, "%s on %s", path, k->device);
    k->replay_tok = calloc((size_t)n_ctx, sizeof *k->replay_tok);
    k->h_ids = calloc((size_t)(k->n_moe ? k->n_moe : 1) * GK_ROWS * (size_t)(hp->n_expert_used ? hp->n_expert_used : 1),
                      sizeof *k->h_ids);
    if (!k->replay_tok || !k->h_ids) return em_err_set(err, EM_ENOMEM, "out of memory for the GPU target");
    return EM_OK;
}

static int open_device(gk *k, int index, em_err *err) {
    int rc = em_gpu_open(index, &k->gpu, err);
    if (rc) return rc;
    k->index = index;
    const em_gpu_info *gi = em_gpu_get_info(k->gpu);
    snprintf(k->device, sizeof k->device, "cuda:%d (%s)", index, gi ? gi->name : "?");
    return EM_OK;
}

/* --devices: the routed expert stacks are left to kimi_cuda_ep.c, which places them. */
static int mark_expert_stacks(gk *k, em_err *err) {
    for (int l = 0; l < k->hp.n_layer; l++) {
        const kimi_ffn_w *f = &k->w.layers[l].ffn;
        const em_mat *stacks[3] = { &f->gate_exps, &f->up_exps, &f->down_exps };
        for (int i = 0; f->moe && i < 3; i++) {
            gk_weight *w = (gk_weight *)table_find(&k->tab, stacks[i]->data);
            if (!w || w->is_vec)
                return em_err_set(err, EM_EINVAL, "%s: layer %d's expert stacks are not in the weight table",
                                  em_gguf_path(k->g), l);
            w->expert_stack = true;
        }
    }
    return EM_OK;
}

/* Opens kimi_cuda_ep.c over opts' devices with the MoE layers' stacks; gpu0_reserved: what
 * this device needs besides its experts. */
static int place_experts(gk *k, const em_model_opts *opts, uint64_t gpu0_reserved, em_err *err) {
    const kimi_hparams *hp = &k->hp;
    if (k->n_moe == 0)
        return em_err_set(err, EM_EINVAL, "%s: --devices spreads routed experts, and this model has none",
                          em_gguf_path(k->g));
    gk_ep_layer *layers = calloc((size_t)k->n_moe, sizeof *layers);
    if (!layers) return em_err_set(err, EM_ENOMEM, "out of memory for the expert placement");
    for (int l = 0, m = 0; l < hp->n_layer; l++) {
        const kimi_ffn_w *f = &k->w.layers[l].ffn;
        if (f->moe) layers[m++] = (gk_ep_layer){ &f->gate_exps, &f->up_exps, &f->down_exps };
    }
    const int64_t cols = layers[0].gate->cols; /* the model's width, or K3's latent */
    const gk_ep_spec spec = { .devices = opts->cuda_devices, .n_devices = opts->n_cuda_devices, .gpu0 = k->gpu,
                              .gpu0_reserved = gpu0_reserved, .layers = layers, .n_layers = k->n_moe,
                              .n_expert = hp->n_expert, .k = hp->n_expert_used, .ffn = hp->n_ff_exp, .cols = cols,
                              .act = hp->situ ? EM_GPU_ACT_SITU : EM_GPU_ACT_SWIGLU, .situ_beta = hp->situ_beta,
                              .situ_lin_beta = hp->situ_lin_beta, .path = em_gguf_path(k->g) };
    int rc = gk_ep_open(&k->ep, &spec, err);
    free(layers);
    return rc;
}

static int load_and_upload(gk *k, const em_model_opts *opts, em_err *err) {
    const em_wload_hook hook = { .mat = hook_mat, .vec = hook_vec, .ud = k };
    int rc = kimi_load(k->g, &hook, &k->hp, &k->w, err);
    if (rc) return rc;
    if (opts->moe_storage == EM_MOE_SSD)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: --moe-storage ssd does not run on %s yet (experts are resident in "
                          "device memory): use resident, or the CPU", em_gguf_path(k->g), k->device);
    if ((rc = set_info(k, opts, err)) || (rc = table_index(&k->tab, err))) return rc;
    if (opts->n_cuda_devices > 0 && (rc = mark_expert_stacks(k, err))) return rc;
    uint64_t weights = 0, log_bytes, cache_bytes;
    for (int i = 0; i < k->tab.n && !rc; i++)
        if (table_find(&k->tab, k->tab.w[i].key) == &k->tab.w[i] && !k->tab.w[i].expert_stack)
            weights += weight_bytes(k, i, err, &rc);
    if (rc) return em_err_prefix(err, "%s", em_gguf_path(k->g));
    const uint64_t state = state_sizes(k, &log_bytes, &cache_bytes);
    carver c = { 0 };
    carve_bufs(k, &c, &k->B, GK_ROWS, false);
    if ((rc = fit_check(k, weights, state, c.at, err)) ||
        (opts->n_cuda_devices > 0 && (rc = place_experts(k, opts, weights + state + c.at, err))) ||
        (rc = upload_weights(k, weights, err)) ||
        (rc = layer_vectors(k, err)) || (rc = make_state(k, log_bytes, cache_bytes, err)) ||
        (rc = em_gpu_alloc(k->gpu, c.at, "GPU pass buffers", &k->buf_mem, err)) ||
        /* zeroed once: some kernels load whole 16-byte quads of which they use a part (the MLA
         * context's probabilities past a row's length), and nothing should read bytes nothing
         * wrote (compute-sanitizer initcheck) */
        (rc = em_gpu_memset(k->gpu, k->buf_mem, 0, c.at, err)))
        return rc;
    c = (carver){ .base = k->buf_mem };
    carve_bufs(k, &c, &k->B, GK_ROWS, false);
    k->P = &k->B;
    cost_setup(k);
    wide_setup(k);
    return em_gpu_sync(k->gpu, err);
}

int em_kimi_cuda_open(em_target **out, em_gguf *g, const em_model_opts *opts, int index, em_err *err) {
    *out = NULL;
    gk *k = calloc(1, sizeof *k);
    if (!k) {
        em_gguf_close(g);
        return em_err_set(err, EM_ENOMEM, "out of memory for the GPU target");
    }
    k->g = g;
    k->base.ops = &gk_ops;
    int rc = open_device(k, index, err);
    if (!rc) rc = load_and_upload(k, opts, err);
    if (rc) {
        gk_close(&k->base);
        return rc;
    }
    gk_reset(&k->base);
    *out = &k->base;
    return EM_OK;
}
