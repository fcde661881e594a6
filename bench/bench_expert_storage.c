/* bench_expert_storage: routed experts resident vs read from storage (model/ + experts/), on
 * one model, in one process per storage mode (peak RSS is per process):
 *
 *   bench_expert_storage -m MODEL.gguf [--storage resident|ssd] [--cache-frac F]
 *                        [-p P] [-n N] [--verify-steps S] [--threads T]
 *
 * 1. the disk's sequential read rate: the model file read front to back with O_DIRECT in
 *    4 MiB requests (buffered after dropping its pages when O_DIRECT is refused), up to 2 GiB;
 * 2. the target opened with the storage mode; with ssd the cache budget holds F (default
 *    0.25) of all routed experts (in slots: ceil(F x experts) x the largest slot);
 * 3. prefill P (default 16) pseudo-random tokens, then N (default 16) plain decoding steps
 *    (verify 1 + commit 1, greedy), then for W = 2, 4, 8: S (default 4) steps of verify(W) +
 *    commit(W) with pseudo-random tokens;
 * 4. per phase: expert bytes read per token (per verified row for W > 1), hits, misses, the
 *    read rate while waiting for reads (bytes / read seconds) and its share of the
 *    sequential rate, tok/s; then peak RSS (VmHWM) and the resident / file-backed / budget
 *    bytes the target reports.
 * A benchmark (prints lines of key=value), not a test; bench/expert_rss.sh runs both modes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"

/* A "Key: N kB" line of /proc/self/status, in bytes. */
static uint64_t status_bytes(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256], fmt[64];
    snprintf(fmt, sizeof fmt, "%s: %%llu kB", key);
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, fmt, &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib << 10;
}

static uint64_t vm_hwm_bytes(void) { return status_bytes("VmHWM"); }

/* Sequential read rate of path (bytes/s), O_DIRECT when allowed. */
static double seq_rate(const char *path, bool *direct) {
    int fd = open(path, O_RDONLY | O_DIRECT);
    *direct = fd >= 0;
    if (fd < 0) {
        fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    const size_t chunk = 4u << 20;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, chunk)) {
        close(fd);
        return 0;
    }
    uint64_t done = 0;
    double t0 = em_time_now();
    ssize_t r;
    while (done < (2ull << 30) && (r = pread(fd, buf, chunk, (off_t)done)) > 0) done += (uint64_t)r;
    double t = em_time_now() - t0;
    free(buf);
    close(fd);
    return t > 0 ? (double)done / t : 0;
}

static int32_t next_tok(uint64_t *s, int n) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return (int32_t)(((*s * 2685821657736338717ull) >> 33) % (uint64_t)n);
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

typedef struct phase {
    em_target_expert_counts c0;
    double t0;
} phase;

static void phase_begin(const em_target *t, phase *p) {
    em_target_expert_stats(t, -1, &p->c0, NULL);
    p->t0 = em_time_now();
}

static void phase_end(const em_target *t, const phase *p, const char *name, int rows, double seq_bps) {
    double dt = em_time_now() - p->t0;
    em_target_expert_counts c;
    em_target_expert_stats(t, -1, &c, NULL);
    uint64_t bytes = c.bytes_read - p->c0.bytes_read, hits = c.hits - p->c0.hits, misses = c.misses - p->c0.misses;
    double rs = c.read_seconds - p->c0.read_seconds, rate = rs > 0 ? (double)bytes / rs : 0;
    printf("phase=%s rows=%d bytes_per_row=%.0f hits=%llu misses=%llu hit_rate=%.3f read_GBps=%.3f "
           "read_vs_seq=%.2f read_share_of_time=%.2f rows_per_s=%.2f\n",
           name, rows, (double)bytes / rows, (unsigned long long)hits, (unsigned long long)misses,
           hits + misses ? (double)hits / (double)(hits + misses) : 0.0, rate / 1e9, seq_bps > 0 ? rate / seq_bps : 0.0,
           dt > 0 ? rs / dt : 0.0, rows / dt);
}

int main(int argc, char **argv) {
    const char *model = NULL, *storage = "ssd";
    double frac = 0.25;
    int n_prompt = 16, n_gen = 16, vsteps = 4, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--storage")) storage = v;
        else if (!strcmp(a, "--cache-frac")) frac = atof(v);
        else if (!strcmp(a, "-p")) n_prompt = atoi(v);
        else if (!strcmp(a, "-n")) n_gen = atoi(v);
        else if (!strcmp(a, "--verify-steps")) vsteps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "bench_expert_storage: unknown flag %s\n", a);
            return 2;
        }
    }
    if (!model || n_prompt < 1 || n_gen < 0 || vsteps < 0 || !(frac > 0)) {
        fprintf(stderr, "usage: bench_expert_storage -m MODEL.gguf [--storage resident|ssd] [--cache-frac F] "
                        "[-p P] [-n N] [--verify-steps S] [--threads T]\n");
        return 2;
    }
    bool ssd = !strcmp(storage, "ssd"), direct;
    double seq = ssd ? seq_rate(model, &direct) : 0;
    if (ssd) printf("seq_read_GBps=%.3f seq_direct=%d\n", seq / 1e9, direct);
    em_err err = { 0 };
    em_model_opts o = { .n_threads = threads, .moe_storage = ssd ? EM_MOE_SSD : EM_MOE_RESIDENT,
                        .n_ctx = n_prompt + n_gen + 3 * 8 * vsteps + 8, .expert_cache_bytes = 1ull << 40 };
    em_target *t;
    if (ssd) { /* the slot size and the expert count first (opening maps; nothing is read) */
        if (em_model_open(&t, model, &o, &err)) goto fail;
        em_target_expert_counts c;
        em_target_expert_stats(t, -1, &c, NULL);
        const uint64_t experts = c.n_experts;
        em_target_close(t);
        uint64_t slots = (uint64_t)(frac * (double)experts + 0.999);
        o.expert_cache_bytes = (slots ? slots : 1) * c.slot_bytes;
        printf("routed_experts=%llu slot_bytes=%llu cache_slots=%llu\n", (unsigned long long)experts,
               (unsigned long long)c.slot_bytes, (unsigned long long)slots);
    }
    if (em_model_open(&t, model, &o, &err)) goto fail;
    const em_target_info *info = em_target_get_info(t);
    const int V = info->n_vocab;
    float *logits = malloc((size_t)8 * (size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)(n_prompt > 8 ? n_prompt : 8) * sizeof(int32_t));
    if (!logits || !tok) return 1;
    uint64_t s = 1;
    for (int i = 0; i < n_prompt; i++) tok[i] = next_tok(&s, V);
    phase p;
    phase_begin(t, &p);
    em_rows last = { .logits = logits, .last_only = true };
    if (em_target_prefill(t, tok, n_prompt, &last, &err)) goto fail;
    phase_end(t, &p, "prefill", n_prompt, seq);
    phase_begin(t, &p);
    for (int i = 0; i < n_gen; i++) {
        tok[0] = argmax(logits, V);
        em_rows one = { .logits = logits };
        if (em_target_verify(t, tok, 1, &one, &err) || em_target_commit(t, 1, &err)) goto fail;
    }
    if (n_gen > 0) phase_end(t, &p, "decode", n_gen, seq);
    for (int w = 2; w <= 8 && vsteps > 0; w *= 2) {
        char name[24];
        snprintf(name, sizeof name, "verify%d", w);
        em_cost cost = em_target_cost(t, w);
        phase_begin(t, &p);
        for (int i = 0; i < vsteps; i++) {
            for (int j = 0; j < w; j++) tok[j] = next_tok(&s, V);
            em_rows rows = { .logits = logits };
            if (em_target_verify(t, tok, w, &rows, &err) || em_target_commit(t, w, &err)) goto fail;
        }
        phase_end(t, &p, name, w * vsteps, seq);
        printf("cost_hint_%s_bytes=%llu\n", name, (unsigned long long)cost.bytes_read);
    }
    em_target_expert_counts c;
    em_target_expert_stats(t, -1, &c, NULL);
    printf("storage=%s resident_bytes=%llu file_bytes=%llu cache_budget=%llu cache_bytes=%llu peak_rss=%llu "
           "rss_over_resident_plus_budget=%lld\n",
           ssd ? "ssd" : "resident", (unsigned long long)c.resident_bytes, (unsigned long long)c.file_bytes,
           (unsigned long long)c.cache_budget, (unsigned long long)c.cache_bytes, (unsigned long long)vm_hwm_bytes(),
           (long long)vm_hwm_bytes() - (long long)(c.resident_bytes + c.cache_budget));
    printf("rss_now=%llu rss_anon=%llu rss_file=%llu\n", (unsigned long long)status_bytes("VmRSS"),
           (unsigned long long)status_bytes("RssAnon"), (unsigned long long)status_bytes("RssFile"));
    em_target_close(t);
    free(logits);
    free(tok);
    return 0;
fail:
    fprintf(stderr, "bench_expert_storage: %s\n", err.msg);
    return 1;
}
