/* model/kda: the Kimi Delta Attention (KDA) recurrent core on the CPU, working on rows that
 * the caller has already projected (q, k, v, f, b, output gate). It owns the short causal
 * conv + SiLU, the q/k L2 norm, the decay gate (Kimi-Linear softplus form or the K3 bounded
 * form), beta, the gated delta rule per head in fp32 (a fused recurrent form, or the chunked
 * WY form), the per-head gated RMSNorm of the output, and the ReplaySSM commit that
 * speculative decoding needs (forward n rows without touching the committed state, then fold
 * in only the first k of them).
 *
 * Per token t, head h (D = head_dim, S is [D_k][D_v], row r = key channel r):
 *   q,k,v = SiLU(causal depthwise conv over [window; rows])      (no bias; tap d_conv-1 = now)
 *   q = q * rsqrt(sum q^2 + l2_eps) / sqrt(D);   k = k * rsqrt(sum k^2 + l2_eps)
 *   g = ssm_a[h] * softplus(f + dt_bias)   (softplus(x) = x for x > 20)          Kimi-Linear
 *   g = lb * sigmoid(-ssm_a[h] * (f + dt_bias)) = lb * sigmoid(exp(A_log) (f+dt_bias))   K3
 *   beta = sigmoid(b)
 *   S <- diag(exp(g)) S;  S <- S + beta k (v - S^T k)^T;  o = S^T q      (o reads updated S)
 *   out = o_norm * o * rsqrt(mean(o^2) + norm_eps) * sigmoid(g2)          (per head, over D)
 *
 * Thread safety: calls on different states/logs may run concurrently; a pool is used by one
 * call at a time. Work is split by head, so results do not depend on the thread count. */
#ifndef EM_MODEL_KDA_H
#define EM_MODEL_KDA_H

#include "base/base.h"

typedef struct em_kda_dims {
    int n_head, head_dim; /* d_inner = n_head * head_dim */
    int d_conv;           /* short conv kernel width (4); 1..EM_KDA_MAX_CONV */
    float norm_eps;       /* gated output RMSNorm eps (rms_norm_eps, 1e-5) */
    /* eps added to the SUM of squares in the q/k L2 norm. HF transformers and fla use 1e-6
     * (x * rsqrt(sum x^2 + 1e-6)). llama.cpp instead calls ggml_l2_norm with eps =
     * rms_norm_eps (1e-5), which computes x / max(||x||, eps): a different (and for any
     * non-tiny x, identical up to rounding) formula. We follow HF: pass 1e-6. */
    float l2_eps;
    bool bounded_gate;      /* K3: g = lb*sigmoid(exp(A_log)*(f+dt_bias)); else Kimi-Linear */
    float gate_lower_bound; /* lb (< 0) for the K3 form; ignored otherwise */
    /* Which form a forward of n rows uses (a speed choice only: both agree to fp32 rounding):
     * the chunked WY form when chunk_min_rows > 0 and n >= chunk_min_rows, else the recurrent
     * form. 0 (the default) = always recurrent: at head_dim 128 with AVX2 the fused
     * recurrent sweep (4 D^2 flops per row) measured 20-40% faster per row than the chunked
     * form (3 D^2 in GEMMs plus O(chunk * D) per row) on both Zen 4 and Xeon; see
     * bench/bench_kda.c. 2 mirrors transformers (recurrent only for single-token decode),
     * 65 Moonshot's remote code (recurrent up to 64 rows). Not part of the layer's identity:
     * logs and states do not depend on it (it is ignored when matching a log to dims). */
    int chunk_min_rows;
} em_kda_dims;

#define EM_KDA_MAX_CONV 16

/* Weights, all f32, owned by the caller (dequantized at load). */
typedef struct em_kda_params {
    const float *conv_q, *conv_k, *conv_v; /* [d_inner][d_conv]; tap d_conv-1 = current row */
    const float *ssm_a;                    /* [n_head] = -exp(A_log), as GGUF stores it */
    const float *dt_bias;                  /* [d_inner] */
    const float *o_norm;                   /* [head_dim], shared by all heads */
} em_kda_params;

/* Recurrent state of one KDA layer for one sequence. conv and S are allocations made by
 * em_kda_state_init (freed by em_kda_state_free), or caller memory: then the caller sets both
 * (3*(d_conv-1)*d_inner and n_head*head_dim^2 floats, em_kda_state_floats in all; S 64-byte
 * aligned is best), leaves mem NULL and never calls em_kda_state_free. An owned S (mem set)
 * may be exchanged with a log's final state by em_kda_commit: S and mem then point into the
 * log's former buffer, which the state owns from then on (and the log owns the old one). */
typedef struct em_kda_state {
    float *conv; /* [3][d_conv-1][d_inner]: last pre-conv inputs of q, k, v; oldest first */
    float *S;    /* [n_head][head_dim (key)][head_dim (value)] fp32 */
    void *mem;   /* the allocation S lies in (64-byte aligned inside it); NULL: caller memory */
} em_kda_state;

/* EM_EINVAL naming the field when dims are unusable (n_head outside 1..65536, head_dim
 * outside 1..1024, d_conv outside 1..EM_KDA_MAX_CONV, negative or non-finite eps, bounded gate
 * with lb >= 0 or non-finite, negative chunk_min_rows). Every entry point checks this too. */
int em_kda_dims_check(const em_kda_dims *d, em_err *err);

size_t em_kda_state_floats(const em_kda_dims *d); /* conv + S floats; 0 if dims are bad */
int em_kda_state_init(em_kda_state *s, const em_kda_dims *d, em_err *err); /* zeroed */
void em_kda_state_free(em_kda_state *s);                                  /* NULL-safe */
void em_kda_state_reset(em_kda_state *s, const em_kda_dims *d);           /* zeros: seq start */
void em_kda_state_copy(em_kda_state *dst, const em_kda_state *src, const em_kda_dims *d);

/* The transition log of the last em_kda_forward that was given this log: per row the post-conv
 * L2-normed k, post-conv v, decay g, beta, and the pre-conv q/k/v inputs (for the conv
 * window), i.e. what em_kda_commit needs. Sized for max_rows at create. With keep_final the
 * log also keeps the state S after all n rows (n_head*D*D floats), so commit(n) (every row
 * accepted) is an exchange of buffers (a copy into caller memory) instead of a replay. */
typedef struct em_kda_log em_kda_log;

int em_kda_log_create(em_kda_log **out, const em_kda_dims *d, int max_rows, bool keep_final,
                      em_err *err);
void em_kda_log_free(em_kda_log *l); /* NULL-safe */
int em_kda_log_rows(const em_kda_log *l); /* n of the last forward (0 before any) */

/* Forward n (>= 0) rows on top of *committed WITHOUT modifying it.
 *   qkv_pre: [n][3*d_inner] pre-conv projections (q | k | v)
 *   f_raw:   [n][d_inner]   f_b(f_a(x)), before dt_bias
 *   b_raw:   [n][n_head]    before sigmoid
 *   g2:      [n][d_inner]   output-gate pre-activation, before sigmoid
 *   out:     [n][d_inner]   RMSNorm_per_head(o) * o_norm * sigmoid(g2), ready for o_proj
 * d->chunk_min_rows picks the recurrent or the chunked WY form (chunk EM_KDA_CHUNK); both
 * agree to fp32 rounding. log (may be NULL) receives the transitions
 * (n <= its max_rows, dims equal). pool may be NULL; work is split over heads. scratch (may be
 * NULL: then malloc/free inside, for tests and one-off calls) gives per-thread workspace of
 * em_kda_scratch_bytes; the caller resets it. Inputs must not alias out. */
int em_kda_forward(const em_kda_dims *d, const em_kda_params *p, const em_kda_state *committed,
                   int n, const float *qkv_pre, const float *f_raw, const float *b_raw,
                   const float *g2, float *out, em_kda_log *log, em_pool *pool,
                   em_arena *scratch, em_err *err);

/* Prefill / plain decode: as em_kda_forward (same outputs, bit for bit), but folds all n rows
 * into *st in place (no log, no copy of S). st ends as em_kda_forward + em_kda_commit(n) leave
 * it: bit for bit with the recurrent form or a keep_final log, else up to fp32 rounding (the
 * replay is recurrent, the forward was chunked). */
int em_kda_forward_commit(const em_kda_dims *d, const em_kda_params *p, em_kda_state *st, int n,
                          const float *qkv_pre, const float *f_raw, const float *b_raw,
                          const float *g2, float *out, em_pool *pool, em_arena *scratch,
                          em_err *err);

/* Fold the first k (0..n) logged transitions of the last forward into *st (ReplaySSM). st must
 * hold the state that forward was given as `committed` (unchanged since): afterwards the conv
 * window and S are what feeding those k rows one by one would leave (recurrent replay of k
 * rows, bit-identical to k one-row em_kda_forward_commit calls; when k == n and the log keeps
 * the final state, that state: st's owned S buffer and the log's are exchanged, no copy). The log is consumed: a second commit before the next forward
 * is EM_EINVAL (it would fold the rows twice). pool may be NULL. */
int em_kda_commit(const em_kda_dims *d, em_kda_state *st, em_kda_log *log, int k,
                  em_pool *pool, em_err *err);

/* Upper bound of the scratch bytes one forward call of n rows takes from the arena with this
 * many pool threads (per-thread workspace, independent of n, plus n_head*D*D floats when n >
 * EM_KDA_CHUNK and the forward has nowhere else to keep each head's state between chunks). */
size_t em_kda_scratch_bytes(const em_kda_dims *d, int n_threads, int n);

#define EM_KDA_CHUNK 64 /* rows per chunk of the WY form, and per block of either form */

#endif
