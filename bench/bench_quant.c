/* bench_quant: how close the matrix-vector product gets to the machine's memory bandwidth,
 * per weight type. A benchmark (prints a table), not a test: nothing here asserts speed.
 *
 * 1. Read bandwidth, measured in the same run: the sum of a buffer of at least 4x the
 *    last-level cache, split over 1 and over N threads (best and median of --runs).
 * 2. Per weight type: em_matvec over a matrix of --weight-bytes (default: at least 1 GiB and
 *    2x the LLC) with one quantized activation row; weight GB/s streamed (min / median /
 *    max over --runs after a warm-up) and the median as a % of the median N-thread read
 *    bandwidth. Because other processes on a shared machine come and go, each matvec run is
 *    also paired with a plain N-thread read of the same weight bytes just before it, and the
 *    median matvec is given as a % of that paired read as well.
 *    --path matmul times em_matmul_act with one activation row instead (decoding's path:
 *    the register-tiled kernels where the type has them) in place of em_matvec; with
 *    --act-rows J, J rows (a verify or prefill width; GB/s still counts each weight once).
 *    --path packed: the same on a packed copy of the matrix (compute/packed.c; Q8_0 only, the
 *    rows cut to a multiple of 16), the layout CPU models multiply.
 * Buffers are touched (written) before timing, and 2 MiB-aligned with MADV_HUGEPAGE so TLB
 * behaviour is the same for both measurements.
 *
 * usage: bench_quant [--threads N] [--types q8_0,q4_K,...] [--runs R] [--cols C]
 *                    [--weight-bytes SIZE] [--bw-bytes SIZE] [--isa scalar|avx2|avx512]
 *                    [--path matvec|matmul|packed] [--act-rows J] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"
#include "compute/compute.h"
#include "quant/blocks.h"
#include "quant/quant.h"

#include "bench_util.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)
#define MAX_RUNS 64

static const int all_types[] = {
    EM_TYPE_Q8_0, EM_TYPE_Q4_0, EM_TYPE_Q4_1, EM_TYPE_Q5_0, EM_TYPE_Q5_1, EM_TYPE_MXFP4, EM_TYPE_Q2_K,
    EM_TYPE_Q3_K, EM_TYPE_Q4_K, EM_TYPE_Q5_K, EM_TYPE_Q6_K, EM_TYPE_BF16, EM_TYPE_F16,  EM_TYPE_F32,
    EM_TYPE_IQ1_S, EM_TYPE_IQ1_M, EM_TYPE_IQ2_XXS, EM_TYPE_IQ2_XS, EM_TYPE_IQ2_S, EM_TYPE_IQ3_XXS,
    EM_TYPE_IQ3_S, EM_TYPE_IQ4_NL, EM_TYPE_IQ4_XS,
};
#define N_ALL_TYPES (int)(sizeof all_types / sizeof all_types[0])

typedef struct options {
    int threads, runs, isa;
    bool matmul; /* --path matmul: em_matmul_act (decoding's path), not em_matvec */
    bool packed; /* --path packed: em_matmul_act on a packed copy */
    int act_rows; /* --act-rows J: activation rows of the matmul path (1: decoding) */
    int64_t cols;
    uint64_t weight_bytes, bw_bytes; /* 0: automatic */
    int types[EM_TYPE_COUNT];
    int n_types;
} options;

/* ---- small utilities ---------------------------------------------------------------------- */

typedef struct stats {
    double min, median, max;
} stats;

static stats summarize(double *v, int n) {
    const double median = bench_median(v, n);
    stats s = { v[0], median, v[n - 1] };
    return s;
}

static void *big_alloc(uint64_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 2 * MIB, (size_t)bytes) != 0) return NULL;
    madvise(p, (size_t)bytes, MADV_HUGEPAGE); /* a hint; failure is harmless */
    return p;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- last-level cache size ---------------------------------------------------------------- */

/* Largest cache of the highest level cpu0 sees in sysfs; else sysconf; else 32 MiB. */
static uint64_t llc_bytes(const char **source) {
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int level = fgets(buf, sizeof buf, f) ? atoi(buf) : 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(path, "r");
        if (!f) continue;
        uint64_t size = 0;
        if (fgets(buf, sizeof buf, f)) {
            buf[strcspn(buf, "\n")] = 0;
            if (em_parse_size(buf, &size, NULL) != 0) size = 0;
        }
        fclose(f);
        if (level > best_level || (level == best_level && size > best)) {
            best_level = level;
            best = size;
        }
    }
    if (best) {
        *source = "sysfs";
        return best;
    }
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l3 > 0) {
        *source = "sysconf L3";
        return (uint64_t)l3;
    }
    if (l2 > 0) {
        *source = "sysconf L2";
        return (uint64_t)l2;
    }
    *source = "guess";
    return 32 * MIB;
}

/* ---- read bandwidth ----------------------------------------------------------------------- */

/* Seconds to read the first `bytes` of buf with the pool's threads (one contiguous part each). */
static double time_sum(em_pool *pool, const uint8_t *buf, uint64_t bytes) {
    return em_read_seconds(pool, buf, bytes, bytes / (uint64_t)em_pool_threads(pool));
}

/* GB/s of each of `runs` sums of buf (after one warm-up). */
static void measure_bandwidth(em_pool *pool, const uint8_t *buf, uint64_t bytes, int runs, double *gbs) {
    uint64_t counted = bytes / (uint64_t)em_pool_threads(pool) / 128 * 128 * (uint64_t)em_pool_threads(pool);
    for (int r = -1; r < runs; r++) {
        double dt = time_sum(pool, buf, bytes);
        if (r >= 0) gbs[r] = (double)counted / dt / 1e9;
    }
}

/* ---- weights ------------------------------------------------------------------------------ */

static uint16_t fp16_scale(uint64_t *s, float lo) {
    float v = lo * (1.0f + (float)(xorshift(s) % 1000) / 1000.0f);
    return em_fp32_to_fp16(xorshift(s) & 1 ? -v : v);
}

/* Fills n values of type t at p with valid random data: random bits with sane scale fields
 * (finite, no subnormals), or random floats for the float types. */
static void fill_random(int t, uint8_t *p, int64_t n, uint64_t *s) {
    if (t == EM_TYPE_F32 || t == EM_TYPE_F16 || t == EM_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = (float)((int64_t)(xorshift(s) % 2001) - 1000) / 1000.0f;
            if (t == EM_TYPE_F32) memcpy(p + 4 * i, &v, 4);
            uint16_t h = t == EM_TYPE_F16 ? em_fp32_to_fp16(v) : em_fp32_to_bf16(v);
            if (t != EM_TYPE_F32) memcpy(p + 2 * i, &h, 2);
        }
        return;
    }
    uint64_t bytes = 0;
    em_type_row_bytes(t, (uint64_t)n, &bytes, NULL);
    for (uint64_t i = 0; i < bytes; i++) p[i] = (uint8_t)xorshift(s);
    int blk = em_type_get(t)->block_elems;
    for (int64_t b = 0; b < n / blk; b++) {
        switch (t) {
        case EM_TYPE_Q8_0: ((em_block_q8_0 *)p)[b].d = fp16_scale(s, 0.01f); break;
        case EM_TYPE_Q4_0: ((em_block_q4_0 *)p)[b].d = fp16_scale(s, 0.1f); break;
        case EM_TYPE_Q5_0: ((em_block_q5_0 *)p)[b].d = fp16_scale(s, 0.05f); break;
        case EM_TYPE_Q4_1:
            ((em_block_q4_1 *)p)[b].d = fp16_scale(s, 0.1f);
            ((em_block_q4_1 *)p)[b].m = fp16_scale(s, 0.5f);
            break;
        case EM_TYPE_Q5_1:
            ((em_block_q5_1 *)p)[b].d = fp16_scale(s, 0.05f);
            ((em_block_q5_1 *)p)[b].m = fp16_scale(s, 0.5f);
            break;
        case EM_TYPE_MXFP4: ((em_block_mxfp4 *)p)[b].e = (uint8_t)(120 + xorshift(s) % 10); break;
        case EM_TYPE_Q2_K:
            ((em_block_q2_K *)p)[b].d = fp16_scale(s, 0.02f);
            ((em_block_q2_K *)p)[b].dmin = fp16_scale(s, 0.02f);
            break;
        case EM_TYPE_Q3_K: ((em_block_q3_K *)p)[b].d = fp16_scale(s, 0.01f); break;
        case EM_TYPE_Q4_K:
            ((em_block_q4_K *)p)[b].d = fp16_scale(s, 0.003f);
            ((em_block_q4_K *)p)[b].dmin = fp16_scale(s, 0.003f);
            break;
        case EM_TYPE_Q5_K:
            ((em_block_q5_K *)p)[b].d = fp16_scale(s, 0.002f);
            ((em_block_q5_K *)p)[b].dmin = fp16_scale(s, 0.002f);
            break;
        case EM_TYPE_Q6_K: ((em_block_q6_K *)p)[b].d = fp16_scale(s, 0.0005f); break;
        case EM_TYPE_IQ2_XXS: case EM_TYPE_IQ2_XS: case EM_TYPE_IQ2_S: case EM_TYPE_IQ3_XXS:
        case EM_TYPE_IQ3_S: case EM_TYPE_IQ1_S: case EM_TYPE_IQ4_NL: case EM_TYPE_IQ4_XS: {
            const uint16_t d = fp16_scale(s, 0.001f); /* the fp16 d leads every IQ block but IQ1_M's */
            memcpy(p + (uint64_t)b * (uint64_t)em_type_get(t)->block_bytes, &d, 2);
            break;
        }
        case EM_TYPE_IQ1_M: /* d is spread over the scale words: keep its exponent finite */
            p[(uint64_t)b * sizeof(em_block_iq1_m) + 55] &= (uint8_t)~0x40;
            break;
        default: break;
        }
    }
}

/* Fills the matrix by repeating a ~1 MiB random template of whole rows (touches every page). */
static void fill_matrix(int t, uint8_t *w, uint64_t row_bytes, int64_t rows, int64_t cols, uint64_t *s) {
    int64_t tmpl_rows = (int64_t)(MIB / row_bytes) + 1;
    if (tmpl_rows > rows) tmpl_rows = rows;
    for (int64_t r = 0; r < tmpl_rows; r++) fill_random(t, w + (uint64_t)r * row_bytes, cols, s);
    uint64_t tmpl = (uint64_t)tmpl_rows * row_bytes, total = (uint64_t)rows * row_bytes;
    for (uint64_t off = tmpl; off < total; off += tmpl)
        memcpy(w + off, w, total - off < tmpl ? total - off : tmpl);
}

/* ---- command line --------------------------------------------------------------------------- */

static int usage(const char *msg) {
    if (msg) fprintf(stderr, "bench_quant: %s\n", msg);
    fprintf(stderr, "usage: bench_quant [--threads N] [--types q8_0,q4_K,...] [--runs R] [--cols C]\n"
                    "                   [--weight-bytes SIZE] [--bw-bytes SIZE] [--isa scalar|avx2|avx512]\n"
                    "                   [--path matvec|matmul|packed] [--act-rows J]\n");
    return 2;
}

static int parse_types(char *list, options *o) {
    o->n_types = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int t = em_type_from_name(tok);
        if (t < 0 || em_dot_act_type(t) < 0) {
            fprintf(stderr, "bench_quant: no dot product for type '%s'\n", tok);
            return -1;
        }
        if (o->n_types < EM_TYPE_COUNT) o->types[o->n_types++] = t;
    }
    return o->n_types > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){ .threads = 2, .runs = 7, .isa = em_isa_default(), .cols = 4096, .act_rows = 1 };
    for (int i = 0; i < N_ALL_TYPES; i++) o->types[o->n_types++] = all_types[i];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(NULL);
        if (i + 1 >= argc) return usage("missing value after a flag");
        const char *v = argv[++i];
        long long x;
        em_err err = { 0 };
        if (!strcmp(a, "--threads")) {
            if (em_parse_int(v, 1, 64, &x, "--threads", &err)) return usage(err.msg);
            o->threads = (int)x;
        } else if (!strcmp(a, "--runs")) {
            if (em_parse_int(v, 5, MAX_RUNS, &x, "--runs", &err)) return usage(err.msg);
            o->runs = (int)x;
        } else if (!strcmp(a, "--cols")) {
            if (em_parse_int(v, 256, 1 << 20, &x, "--cols", &err) || x % 256) return usage("--cols: a multiple of 256");
            o->cols = x;
        } else if (!strcmp(a, "--weight-bytes")) {
            if (em_parse_size(v, &o->weight_bytes, &err)) return usage(err.msg);
        } else if (!strcmp(a, "--bw-bytes")) {
            if (em_parse_size(v, &o->bw_bytes, &err)) return usage(err.msg);
        } else if (!strcmp(a, "--isa")) {
            o->isa = em_isa_from_name(v);
            if (o->isa < 0 || !em_isa_cpu_supports(o->isa)) return usage("--isa: not one this CPU runs");
        } else if (!strcmp(a, "--act-rows")) {
            if (em_parse_int(v, 1, 64, &x, "--act-rows", &err)) return usage(err.msg);
            o->act_rows = (int)x;
        } else if (!strcmp(a, "--path")) {
            if (strcmp(v, "matvec") && strcmp(v, "matmul") && strcmp(v, "packed"))
                return usage("--path: matvec, matmul or packed");
            o->packed = !strcmp(v, "packed");
            o->matmul = o->packed || !strcmp(v, "matmul");
        } else if (!strcmp(a, "--types")) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            if (parse_types(buf, o)) return usage("--types: a comma-separated list of weight types");
        } else {
            return usage("unknown flag");
        }
    }
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------- */

typedef struct bandwidth {
    stats one, many; /* GB/s with 1 thread and with --threads */
} bandwidth;

static int run_bandwidth(const options *o, uint64_t bytes, bandwidth *bw) {
    uint8_t *buf = big_alloc(bytes);
    if (!buf) return -1;
    for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t v = i * 0x9E3779B97F4A7C15ULL;
        memcpy(buf + i, &v, 8);
    }
    double gbs[MAX_RUNS];
    em_pool *one = NULL, *many = NULL;
    if (em_pool_create(&one, 1, NULL) || em_pool_create(&many, o->threads, NULL)) return -1;
    measure_bandwidth(one, buf, bytes, o->runs, gbs);
    bw->one = summarize(gbs, o->runs);
    measure_bandwidth(many, buf, bytes, o->runs, gbs);
    bw->many = summarize(gbs, o->runs);
    em_pool_free(one);
    em_pool_free(many);
    free(buf);
    return 0;
}

static int run_type(const options *o, int t, em_pool *pool, uint8_t *w, uint64_t cap, const bandwidth *bw,
                    uint64_t *seed) {
    uint64_t row_bytes = 0, act_bytes = 0;
    em_err err = { 0 };
    if (em_type_row_bytes(t, (uint64_t)o->cols, &row_bytes, &err) ||
        em_dot_act_bytes(t, o->cols, &act_bytes, &err)) {
        fprintf(stderr, "bench_quant: %s\n", err.msg);
        return -1;
    }
    int64_t rows = (int64_t)(cap / row_bytes);
    if (o->packed) {
        if (t != EM_TYPE_Q8_0) {
            fprintf(stderr, "bench_quant: --path packed: %s cannot be packed (Q8_0 only)\n", em_type_name(t));
            return -1;
        }
        if (rows < EM_PACK_ROWS) {
            fprintf(stderr, "bench_quant: --path packed: --weight-bytes holds %lld rows of %lld columns; packing takes 16\n",
                    (long long)rows, (long long)o->cols);
            return -1;
        }
        rows -= rows % EM_PACK_ROWS;
    }
    uint64_t bytes = (uint64_t)rows * row_bytes;
    fill_matrix(t, w, row_bytes, rows, o->cols, seed);
    const int J = o->matmul ? o->act_rows : 1;
    float *x = malloc((size_t)o->cols * sizeof *x), *y = malloc((size_t)rows * (size_t)J * sizeof *y);
    uint8_t *act = malloc(act_bytes * (size_t)J);
    if (!x || !y || !act) return -1;
    for (int j = 0; j < J; j++) {
        for (int64_t i = 0; i < o->cols; i++) x[i] = (float)((int64_t)(xorshift(seed) % 2001) - 1000) / 1000.0f;
        if (em_dot_quantize_act(t, x, act + (size_t)j * act_bytes, o->cols, &err)) {
            fprintf(stderr, "bench_quant: %s\n", err.msg);
            return -1;
        }
    }
    em_mat m;
    const em_act a = { .type = em_dot_act_type(t), .n = J, .cols = o->cols, .stride = act_bytes, .data = act };
    if (em_mat_init(&m, t, rows, o->cols, w, &err)) {
        fprintf(stderr, "bench_quant: %s\n", err.msg);
        return -1;
    }
    void *packed = NULL;
    if (o->packed) {
        if (!em_mat_packable(&m)) {
            fprintf(stderr, "bench_quant: --path packed: %lld columns cannot be packed\n", (long long)o->cols);
            return -1;
        }
        if (!(packed = malloc((size_t)em_mat_packed_bytes(&m)))) return -1;
        em_mat_pack(&m, packed);
    }
    /* Each run: a plain read of the same weight bytes, then the matvec, so both see the same
     * machine (other processes come and go). */
    double gbs[MAX_RUNS], sum_gbs[MAX_RUNS];
    for (int r = -1; r < o->runs; r++) {
        double t_sum = time_sum(pool, w, bytes);
        double t0 = em_time_now();
        if (o->matmul ? em_matmul_act(pool, &m, &a, y, rows, &err)
                      : em_matvec_isa(pool, o->isa, t, w, rows, o->cols, act, y, &err)) {
            fprintf(stderr, "bench_quant: %s\n", err.msg);
            return -1;
        }
        double dt = em_time_now() - t0;
        if (r >= 0) {
            gbs[r] = (double)bytes / dt / 1e9;
            sum_gbs[r] = (double)bytes / t_sum / 1e9;
        }
    }
    int used = -1;
    em_dot_kernel(t, o->isa, &used);
    stats s = summarize(gbs, o->runs), paired = summarize(sum_gbs, o->runs);
    printf("%-7s %-6s %9llu %8lld %8.2f %8.2f %8.2f %7.0f%% %9.2f %7.0f%%\n", em_type_name(t), em_isa_name(used),
           (unsigned long long)row_bytes, (long long)rows, s.min, s.median, s.max, 100.0 * s.median / bw->many.median,
           paired.median, 100.0 * s.median / paired.median);
    free(packed);
    free(x);
    free(y);
    free(act);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    const char *llc_src = "";
    uint64_t llc = llc_bytes(&llc_src);
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t bw_bytes = o.bw_bytes ? o.bw_bytes : 4 * llc > 512 * MIB ? 4 * llc : 512 * MIB;
    uint64_t w_bytes = o.weight_bytes ? o.weight_bytes : 2 * llc > GIB ? 2 * llc : GIB;
    if (!o.bw_bytes && bw_bytes > phys / 4) bw_bytes = phys / 4;
    if (!o.weight_bytes && w_bytes > phys / 4) w_bytes = phys / 4;
    bw_bytes = bw_bytes / MIB * MIB;
    char s1[32], s2[32], s3[32];
    printf("bench_quant: %d thread(s), %d runs, ISA %s (cpu best %s), LLC %s (%s), read buffer %s, weights %s, "
           "%lld columns\n",
           o.threads, o.runs, em_isa_name(o.isa), em_isa_name(em_isa_cpu_best()), em_format_size(llc, s1, sizeof s1),
           llc_src, em_format_size(bw_bytes, s2, sizeof s2), em_format_size(w_bytes, s3, sizeof s3),
           (long long)o.cols);
    FILE *load = fopen("/proc/loadavg", "r");
    char loadavg[64] = "?";
    if (load) {
        if (!fgets(loadavg, sizeof loadavg, load)) snprintf(loadavg, sizeof loadavg, "?");
        loadavg[strcspn(loadavg, "\n")] = 0;
        fclose(load);
    }
    printf("load average at start (other processes compete for cores and memory): %s\n", loadavg);
    bandwidth bw;
    if (run_bandwidth(&o, bw_bytes, &bw)) {
        fprintf(stderr, "bench_quant: cannot allocate the read buffer\n");
        return 1;
    }
    printf("read bandwidth GB/s (min / median / max): 1 thread %.2f / %.2f / %.2f, %d threads %.2f / %.2f / %.2f\n\n",
           bw.one.min, bw.one.median, bw.one.max, o.threads, bw.many.min, bw.many.median, bw.many.max);
    char what[64];
    snprintf(what, sizeof what,
             o.packed ? "em_matmul_act on packed rows with %d activation row(s)"
             : o.matmul ? "em_matmul_act with %d activation row(s)" : "em_matvec", o.act_rows);
    printf("%s, %d thread(s); GB/s = weight bytes streamed per second (min / median / max);\n"
           "%%bw = median matvec vs the median %d-thread read bandwidth above; 'read same' = median plain read of\n"
           "the same weight bytes, timed right before each matvec run; %%same = median matvec vs that\n",
           what, o.threads, o.threads);
    printf("%-6s %-6s %9s %8s %8s %8s %8s %8s %9s %8s\n", "type", "kernel", "row bytes", "rows", "min", "median",
           "max", "%bw", "read same", "%same");
    uint8_t *w = big_alloc(w_bytes);
    em_pool *pool = NULL;
    if (!w || em_pool_create(&pool, o.threads, NULL)) {
        fprintf(stderr, "bench_quant: cannot allocate %s of weights\n", s3);
        return 1;
    }
    uint64_t seed = 0x2545F4914F6CDD1DULL;
    for (int i = 0; i < o.n_types; i++)
        if (run_type(&o, o.types[i], pool, w, w_bytes, &bw, &seed)) return 1;
    em_pool_free(pool);
    free(w);
    return 0;
}
