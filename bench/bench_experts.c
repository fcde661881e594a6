/* bench_experts: read throughput of expert misses (experts/) against a plain sequential read
 * of the same file. Writes a model of --layers x --experts stacked f16 experts (gate/up
 * [embd, ff], down [ff, embd]) into --dir, then for each path (io_uring / pread x O_DIRECT /
 * buffered) runs every layer with all its experts missing, one union per layer, and reports
 * GB/s of bytes transferred. The page cache is emptied of the file before each pass with
 * posix_fadvise(DONTNEED) (no root needed for clean pages); O_DIRECT passes bypass it anyway.
 * A benchmark (prints a table), not a test.
 *
 * usage: bench_experts [--dir D] [--layers L] [--experts X] [--embd E] [--ff F] [--reps R] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts/experts.h"
#include "quant/quant.h"

static int write_model(const char *path, int L, int X, int E, int F, em_err *err) {
    em_gguf_writer *w;
    int rc = em_gguf_writer_create(&w, path, NULL, err);
    if (rc) return rc;
    char name[64];
    const char *parts[3] = {"gate", "up", "down"};
    for (int l = 0; l < L && !rc; l++)
        for (int p = 0; p < 3 && !rc; p++) {
            int64_t ne[3] = {p == 2 ? F : E, p == 2 ? E : F, X};
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, parts[p]);
            rc = em_gguf_writer_add_tensor(w, name, EM_TYPE_F16, 3, ne, err);
        }
    size_t chunk = 1 << 20;
    uint8_t *buf = malloc(chunk);
    for (size_t i = 0; buf && i < chunk; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    uint64_t total = (uint64_t)L * 3 * (uint64_t)X * (uint64_t)E * (uint64_t)F * 2;
    for (uint64_t done = 0; !rc && buf && done < total; done += chunk)
        rc = em_gguf_writer_write_data(w, buf, total - done < chunk ? total - done : chunk, err);
    if (!rc) rc = em_gguf_writer_finish(w, err);
    em_gguf_writer_free(w);
    free(buf);
    return rc;
}

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static double seq_read(const char *path, uint64_t *bytes) {
    drop_cache(path);
    int fd = open(path, O_RDONLY);
    size_t chunk = 4 << 20;
    char *buf = malloc(chunk);
    *bytes = 0;
    double t0 = em_time_now();
    ssize_t r;
    while (fd >= 0 && buf && (r = read(fd, buf, chunk)) > 0) *bytes += (uint64_t)r;
    double t = em_time_now() - t0;
    free(buf);
    if (fd >= 0) close(fd);
    return t;
}

static int noop(void *ctx, int i, const em_expert_data *d, em_err *err) {
    (void)ctx, (void)i, (void)d, (void)err;
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp";
    int L = 2, X = 32, E = 1024, F = 512, reps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--experts")) X = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--embd")) E = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ff")) F = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (L < 1 || X < 1 || E < 32 || F < 32 || reps < 1 || E % 32 || F % 32) {
        fprintf(stderr, "bad geometry\n");
        return 2;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/bench_experts_%d.gguf", dir, (int)getpid());
    em_err err = {0};
    em_gguf *g = NULL;
    em_expert_store *s = NULL;
    int rc = write_model(path, L, X, E, F, &err);
    if (!rc) rc = em_gguf_open(&g, path, &err);
    if (!rc) rc = em_expert_store_open(&s, g, &err);
    if (rc) {
        fprintf(stderr, "bench_experts: %s\n", err.msg);
        unlink(path);
        return 1;
    }
    char sz[32], per[32];
    uint64_t total = em_expert_store_total_bytes(s);
    printf("model %s: %d layers x %d experts, %s per expert\n", em_format_size(total, sz, sizeof sz), L,
           X, em_format_size(total / (uint64_t)L / (uint64_t)X, per, sizeof per));
    int *all = malloc((size_t)X * sizeof *all);
    for (int e = 0; e < X; e++) all[e] = e;
    for (int r = 0; r < reps; r++) {
        uint64_t b;
        double t = seq_read(path, &b);
        printf("%-28s %8.2f GB/s  (%llu bytes, %.3f s)\n", "sequential read(4 MiB)", b / t / 1e9,
               (unsigned long long)b, t);
        const int modes[2] = {EM_EXPERT_IO_URING, EM_EXPERT_IO_PREAD};
        for (int mi = 0; mi < 2; mi++)
            for (int buffered = 0; buffered < 2; buffered++) {
                em_expert_cache *c;
                em_expert_cache_opts o = {.budget = 1ull << 40, .io = modes[mi], .buffered = buffered};
                if (em_expert_cache_create(&c, s, &o, &err)) {
                    printf("%s: %s\n", mi ? "pread" : "io_uring", err.msg);
                    continue;
                }
                bool uring, direct;
                em_expert_cache_io_info(c, &uring, &direct);
                drop_cache(path);
                double t0 = em_time_now();
                for (int l = 0; l < L && !rc; l++) rc = em_expert_cache_run(c, l, all, X, noop, NULL, &err);
                double t1 = em_time_now() - t0;
                em_expert_stats st;
                em_expert_cache_stats(c, -1, &st);
                char label[64];
                snprintf(label, sizeof label, "misses %s %s", uring ? "io_uring" : "pread",
                         direct ? "O_DIRECT" : "buffered");
                if (rc) printf("%s: %s\n", label, err.msg);
                else
                    printf("%-28s %8.2f GB/s  (%llu bytes in %llu reads, %.3f s)\n", label,
                           st.bytes_read / t1 / 1e9, (unsigned long long)st.bytes_read,
                           (unsigned long long)st.reads, t1);
                em_expert_cache_free(c);
            }
    }
    free(all);
    em_expert_store_close(s);
    em_gguf_close(g);
    unlink(path);
    return rc ? 1 : 0;
}
