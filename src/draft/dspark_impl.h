/* The DSpark/DFlash drafter's state, shared by its loader (dspark_load.c) and its forward
 * pass (dspark.c). Matrices are em_mat views into the drafter's mapped GGUF, or the target's
 * own matrices for a borrowed embedding or LM head (model.h em_target_shared: the target
 * outlives the drafter); vectors are f32 copies in `store`. */
#ifndef EM_DSPARK_IMPL_H
#define EM_DSPARK_IMPL_H

#include "compute/compute.h"
#include "draft/draft_impl.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/weights.h"

enum { DSP_MARKOV_NONE = 0, DSP_MARKOV_VANILLA, DSP_MARKOV_GATED, DSP_MARKOV_RNN };

/* Rows one add_context pass handles at once (longer inputs go in chunks). */
#define DSP_CHUNK 32
/* The vanilla Markov bias cache: at most this many bytes, and this many entries. */
#define DSP_BIAS_CACHE_BYTES (4u << 20)
#define DSP_BIAS_CACHE_MAX 128

typedef struct dsp_layer {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    const float *bq, *bk, *bv; /* NULL without attention bias */
    em_mat wq, wk, wv, wo, gate, up, down;
} dsp_layer;

typedef struct dsp_hparams {
    int d, n_layer, n_head, n_kv, hd, ff;
    int vocab;     /* target vocabulary (Markov W1 rows, proposal ids) */
    int dvocab;    /* LM head rows (== vocab unless a d2t table maps them) */
    int rank;      /* Markov rank, 0: none */
    int markov;    /* DSP_MARKOV_* */
    int block;     /* B */
    int slot0;     /* first slot that is a draft: 0 DSpark (anchor-as-first), 1 DFlash */
    bool causal;   /* in-block attention causal (false for published drafters) */
    bool conf, conf_markov;
    float eps, softcap;
    int32_t mask_id;
    int rope_dims;
    int target_embd, target_layers;
} dsp_hparams;

typedef struct dspark {
    em_drafter base;
    char *path;
    em_gguf *g;
    em_pool *pool;
    em_arena *store;
    dsp_hparams hp;
    em_rope rope;

    em_mat fc, embd, head, w1, w2, gate_w, joint_w;
    const float *hidden_norm, *out_norm, *gate_b, *joint_b, *conf_w, *conf_t;
    float conf_b;
    int32_t *d2t; /* [dvocab] target ids, or NULL */
    dsp_layer *layers;

    int64_t cap;  /* context rows the cache holds */
    float *kc, *vc; /* [n_layer][cap][n_kv * hd] */

    /* scratch, sized at open (rows = max(DSP_CHUNK, B)) */
    float *h, *xn, *q, *k, *v, *att, *fg, *fu, *o, *base_logits, *bias, *row;
    float *cs, *sn;          /* [rows][rope_dims / 2] */
    float *scores;           /* [n_threads][dsp_attn_rows][cap + B] */
    float *e, *state, *zin, *zout, *tmp;
    em_arena *scratch;       /* activation conversions of one product group (compute's em_acts),
                                reset before each; sized at open for two of the largest */

    /* vanilla Markov biases W2 W1[prev] by token, least recently used replaced first: entry i
     * holds bias_rows[i] of token bias_tok[i] (-1: empty); n_bias 0 without a cache */
    int n_bias;
    int32_t *bias_tok;
    uint64_t *bias_used, bias_clock;
    float *bias_rows; /* [n_bias][dvocab] */
    float slots_avg;  /* slots recent blocks used before the caller stopped them */
} dspark;

/* Block rows one attention task takes: all of a head's when the threads are no more than the
 * heads (the cache read once per head), else as many as spread the tasks over the threads. */
static inline int dsp_attn_rows(const dspark *s) {
    const int threads = em_pool_threads(s->pool), heads = s->hp.n_head > 0 ? s->hp.n_head : 1;
    const int groups = (threads + heads - 1) / heads;
    return (s->hp.block + groups - 1) / groups;
}

/* Loads the drafter at draft_path for the target (its shape; embedding and LM head borrowed
 * when the file has none: target must outlive s). */
int dsp_load(dspark *s, const char *draft_path, const em_target_shared *target, const em_draft_opts *o,
             em_err *err);
void dsp_unload(dspark *s);

#endif
