/* tests/compat/synth_k3.c: writes a small random kimi-k3 GGUF (tests/compat/k3_synth.h) for
 * the llama.cpp comparison (tests/k3_llama.sh), and reports how near a tie Ember's expert
 * choices are on a token sequence (so that comparison can tell a near-tie routing flip from a
 * real difference).
 *
 *   synth_k3 OUT.gguf [--variant a|b|c|i|m|k] [--seed N]
 *   synth_k3 margins MODEL.gguf --tokens 1,2,3 [--tie T]
 *        prefill of the tokens; prints `first_tie=R min_margin=M`: R the first row where some
 *        MoE layer's routing margin (selection score of the last chosen expert minus the best
 *        left out) is below T (default 1e-3), or the row count when none is
 *   synth_k3 compare A.f32 B.f32 --n-vocab V --tol T [--rows R]
 *        per row max |A - B| / max |B| over the first R rows (default all); prints the worst
 *        and its row; exit 1 when it exceeds T or a value is not finite
 *
 *   a  8 layers (MLA at 3, 7), AttnRes blocks of 3 (three banks), q-LoRA + output gate, KDA
 *      full-rank gate with lower bound -5, SiTU 4 / 25, latent MoE 64 -> 32 with the routed
 *      norm, 8 experts top-3, one shared expert, renormalised weights x 2.5
 *   b  6 layers (MLA at 3, 5), AttnRes blocks of 4 (two banks), lower bound -3, SiTU 1.5 / 2
 *      (far from linear), latent 48 without the routed norm, 16 experts top-4, two shared
 *      experts, weights not renormalised (x 1)
 *   c  5 layers (MLA at 3, 4), AttnRes off (block 0), no latent (experts at 64), no q-LoRA,
 *      no MLA gate, no lower bound (kimi-linear's softplus decay gate with K3's full-rank
 *      output gate)
 *   i  variant a with routed experts stored as random valid IQ blocks, latent and expert width
 *      256; MoE layers 1, 4, 7: IQ2_XXS / IQ3_XXS / IQ4_XS (gate / up / down); 2, 5: IQ1_S /
 *      IQ2_S / IQ1_M; 3, 6: IQ2_XS / IQ3_S / IQ4_NL
 *   m  variant a with routed experts stored as random valid MXFP4 blocks
 *   k  the K3 shape scaled for bench/bench_k3.sh: hidden 1024, 8 layers (MLA at 3, 7), AttnRes
 *      blocks of 3, latent 512 (K3: half the hidden width), expert width 448 (K3: 6/7 of the
 *      latent), 256 experts top-16, two shared, routed experts Q8_0 (random valid blocks)
 * Prints the path. Exit 0, or 1 with a message. */
#include "k3_synth.h"

#include "model/model.h"

static int margins(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[3], "--tokens")) {
        fprintf(stderr, "usage: synth_k3 margins MODEL.gguf --tokens LIST [--tie T]\n");
        return 2;
    }
    double tie = argc >= 7 && !strcmp(argv[5], "--tie") ? strtod(argv[6], NULL) : 1e-3;
    int32_t tok[4096];
    int n = 0;
    for (char *p = argv[4]; *p && n < 4096; n++) {
        tok[n] = (int32_t)strtol(p, &p, 10);
        if (*p == ',') p++;
    }
    em_err err = { 0 };
    em_target *t = NULL;
    if (em_model_open(&t, argv[2], &(em_model_opts){ .n_threads = 2 }, &err)) {
        fprintf(stderr, "synth_k3: %s\n", err.msg);
        return 1;
    }
    const int m = em_target_get_info(t)->n_moe_layers;
    float *mg = calloc((size_t)n * (size_t)(m ? m : 1), sizeof *mg);
    int rc = !mg || em_target_prefill(t, tok, n, &(em_rows){ .route_margins = mg }, &err);
    if (rc) fprintf(stderr, "synth_k3: %s\n", mg ? err.msg : "out of memory");
    int first = n;
    float least = INFINITY;
    for (int r = 0; !rc && r < n; r++)
        for (int l = 0; l < m; l++) {
            float v = mg[(int64_t)r * m + l];
            if (v < least) least = v;
            if (v < tie && r < first) first = r;
        }
    if (!rc) printf("first_tie=%d min_margin=%.3g\n", first, least);
    free(mg);
    em_target_close(t);
    return rc ? 1 : 0;
}

static float *read_rows(const char *path, int64_t v, int64_t *rows) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    *rows = bytes / (long)sizeof(float) / v;
    float *d = malloc((size_t)(*rows * v) * sizeof(float) + 1);
    if (d && fread(d, sizeof(float), (size_t)(*rows * v), f) != (size_t)(*rows * v)) {
        free(d);
        d = NULL;
    }
    fclose(f);
    return d;
}

static int compare(int argc, char **argv) {
    int64_t v = 0, want_rows = -1;
    double tol = 0;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n-vocab")) v = strtoll(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--tol")) tol = strtod(argv[i + 1], NULL);
        else if (!strcmp(argv[i], "--rows")) want_rows = strtoll(argv[i + 1], NULL, 10);
    }
    int64_t ra, rb;
    float *a = v > 0 ? read_rows(argv[2], v, &ra) : NULL, *b = v > 0 ? read_rows(argv[3], v, &rb) : NULL;
    if (!a || !b || ra != rb || ra == 0) {
        fprintf(stderr, "synth_k3 compare: cannot read two files of the same number of rows of %lld\n", (long long)v);
        return 2;
    }
    int64_t n = want_rows >= 0 && want_rows < ra ? want_rows : ra, at = 0;
    double worst = 0;
    bool finite = true;
    for (int64_t r = 0; r < n; r++) {
        double d = 0, m = 0;
        for (int64_t i = 0; i < v; i++) {
            finite = finite && isfinite(a[r * v + i]) && isfinite(b[r * v + i]);
            d = fmax(d, fabs((double)a[r * v + i] - b[r * v + i]));
            m = fmax(m, fabs((double)b[r * v + i]));
        }
        if (d / m > worst) worst = d / m, at = r;
    }
    printf("rows=%lld worst max|d|/max|logit|=%.3g at row %lld%s\n", (long long)n, worst, (long long)at,
           finite ? "" : " (NOT FINITE)");
    free(a);
    free(b);
    return finite && worst <= tol ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "margins")) return margins(argc, argv);
    if (argc >= 4 && !strcmp(argv[1], "compare")) return compare(argc, argv);
    if (argc < 2) {
        fprintf(stderr, "usage: synth_k3 OUT.gguf [--variant a|b|c|i|m|k] [--seed N]\n");
        return 2;
    }
    k3_synth_opts o = k3_synth_defaults();
    char variant = 'a';
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--variant")) variant = argv[i + 1][0];
        else if (!strcmp(argv[i], "--seed")) o.seed = (uint64_t)strtoull(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "synth_k3: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (variant == 'b') {
        o.n_layer = 6, o.res_block = 4, o.gate_lb = -3.0f, o.situ_beta = 1.5f, o.situ_lin_beta = 2.0f;
        o.n_latent = 48, o.routed_norm = false, o.n_expert = 16, o.n_used = 4, o.n_shared = 2;
        o.expert_norm = false, o.expert_scale = 1.0f;
    } else if (variant == 'c') {
        o.n_layer = 5, o.res_block = 0, o.n_latent = 0, o.q_lora = 0, o.mla_gate = false, o.gate_lb = 0.0f;
    } else if (variant == 'i') {
        /* variant a with IQ experts at latent / expert width 256 (the IQ block): every IQ type
         * of the dynamic GGUFs, one {gate, up, down} set per MoE layer, in turn */
        o.n_latent = 256, o.n_ff_exp = 256, o.n_exp_sets = 3;
        memcpy(o.exp_types, (int[3][3]){ { EM_TYPE_IQ2_XXS, EM_TYPE_IQ3_XXS, EM_TYPE_IQ4_XS },
                                         { EM_TYPE_IQ1_S, EM_TYPE_IQ2_S, EM_TYPE_IQ1_M },
                                         { EM_TYPE_IQ2_XS, EM_TYPE_IQ3_S, EM_TYPE_IQ4_NL } },
               sizeof(int[3][3]));
    } else if (variant == 'm') {
        o.n_exp_sets = 1; /* variant a with MXFP4 experts */
        o.exp_types[0][0] = o.exp_types[0][1] = o.exp_types[0][2] = EM_TYPE_MXFP4;
    } else if (variant == 'k') {
        /* bench/bench_k3.sh: K3's shape scaled to this machine (see there) */
        o.n_embd = 1024, o.n_layer = 8, o.n_head = 8, o.kda_head_dim = 128, o.q_lora = 256, o.kv_lora = 128;
        o.nope = 64, o.rope = 32, o.v_head = 64, o.n_ff = 4096, o.n_expert = 256, o.n_used = 16;
        o.n_latent = 512, o.n_ff_exp = 448, o.n_shared = 2, o.n_vocab = 2048, o.res_block = 3;
        o.n_exp_sets = 1;
        o.exp_types[0][0] = o.exp_types[0][1] = o.exp_types[0][2] = EM_TYPE_Q8_0;
    } else if (variant != 'a') {
        fprintf(stderr, "synth_k3: unknown variant %c\n", variant);
        return 2;
    }
    em_err err = { 0 };
    if (k3_synth_write(argv[1], &o, &err)) {
        fprintf(stderr, "synth_k3: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", argv[1]);
    return 0;
}
