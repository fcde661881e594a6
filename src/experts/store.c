/* experts/store: locates every routed expert's gate / up / down bytes inside the stacked GGUF
 * tensors, once, at open. Invariants: a layer either has all three stacked tensors with
 * consistent shapes or none; every range computed later lies inside its tensor (checked at
 * open: base + X * part_bytes == the tensor's end). Copies shard paths, keeps no reference
 * to the em_gguf. */
#include "experts/experts.h"

#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct em_expert_store {
    int n_layers;
    em_expert_layer *layers;
    int n_shards;
    char **paths;
    uint64_t total;
};

static const char *const part_names[EM_EXPERT_NPARTS] = {"ffn_gate_exps", "ffn_up_exps",
                                                         "ffn_down_exps"};

/* Parses "blk.L.ffn_xxx_exps.weight" into (L, part); false for any other name. */
static bool parse_name(const char *name, int *layer, int *part) {
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    long l = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 7) l = l * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || *p != '.') return false;
    p++;
    for (int k = 0; k < EM_EXPERT_NPARTS; k++) {
        size_t n = strlen(part_names[k]);
        if (strncmp(p, part_names[k], n) == 0 && strcmp(p + n, ".weight") == 0) {
            *layer = (int)l;
            *part = k;
            return true;
        }
    }
    return false;
}

/* Fills part p of layer L from tensor t: [cols, rows, X]. */
static int set_part(em_expert_layer *L, int p, const em_gguf_tensor *t, const char *path,
                    em_err *err) {
    if (t->n_dims != 3 || t->ne[0] <= 0 || t->ne[1] <= 0 || t->ne[2] <= 0 || t->ne[2] > INT32_MAX)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s: expected 3 dimensions [cols, rows, experts]",
                          path, t->name);
    uint64_t rb, pb, all;
    int rc = em_type_row_bytes(t->type, (uint64_t)t->ne[0], &rb, err);
    if (rc) return em_err_prefix(err, "%s: tensor %s", path, t->name);
    if (em_mul_overflow(rb, (uint64_t)t->ne[1], &pb) || em_mul_overflow(pb, (uint64_t)t->ne[2], &all) ||
        all != t->bytes)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s: %llu bytes do not match its shape", path,
                          t->name, (unsigned long long)t->bytes);
    L->shard[p] = t->shard;
    L->type[p] = t->type;
    L->cols[p] = t->ne[0];
    L->rows[p] = t->ne[1];
    L->row_bytes[p] = rb;
    L->part_bytes[p] = pb;
    L->base[p] = t->file_offset;
    return EM_OK;
}

static int check_layer(const em_expert_layer *L, int l, const char *path, em_err *err) {
    bool have[EM_EXPERT_NPARTS];
    int n_have = 0;
    for (int p = 0; p < EM_EXPERT_NPARTS; p++) n_have += have[p] = L->rows[p] > 0;
    if (n_have == 0) return EM_OK;
    if (n_have != EM_EXPERT_NPARTS)
        return em_err_set(err, EM_EFORMAT, "%s: layer %d has only some of ffn_{gate,up,down}_exps",
                          path, l);
    const int64_t F = L->rows[EM_EXPERT_GATE], E = L->cols[EM_EXPERT_GATE];
    if (L->rows[EM_EXPERT_UP] != F || L->cols[EM_EXPERT_UP] != E || L->rows[EM_EXPERT_DOWN] != E ||
        L->cols[EM_EXPERT_DOWN] != F)
        return em_err_set(err, EM_EFORMAT,
                          "%s: layer %d: expert shapes disagree (gate %lldx%lld, up %lldx%lld, "
                          "down %lldx%lld)", path, l, (long long)L->rows[0], (long long)L->cols[0],
                          (long long)L->rows[1], (long long)L->cols[1], (long long)L->rows[2],
                          (long long)L->cols[2]);
    return EM_OK;
}

int em_expert_store_open(em_expert_store **out, const em_gguf *g, em_err *err) {
    *out = NULL;
    em_expert_store *s = em_calloc(1, sizeof *s, "expert store", err);
    if (!s) return EM_ENOMEM;
    const char *path = em_gguf_path(g);
    int64_t n_t = em_gguf_n_tensors(g);
    int max_l = -1, layer, part;
    for (int64_t i = 0; i < n_t; i++)
        if (parse_name(em_gguf_tensor_at(g, i)->name, &layer, &part) && layer > max_l) max_l = layer;
    int rc = EM_OK;
    s->n_layers = max_l + 1;
    if (s->n_layers > 0) {
        s->layers = em_calloc((size_t)s->n_layers, sizeof *s->layers, "expert layers", err);
        if (!s->layers) rc = EM_ENOMEM;
    }
    for (int64_t i = 0; !rc && i < n_t; i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (!parse_name(t->name, &layer, &part)) continue;
        em_expert_layer *L = &s->layers[layer];
        rc = set_part(L, part, t, path, err);
        if (!rc && L->n_expert != 0 && L->n_expert != (int)t->ne[2])
            rc = em_err_set(err, EM_EFORMAT, "%s: tensor %s: %lld experts, other parts of layer %d have %d",
                            path, t->name, (long long)t->ne[2], layer, L->n_expert);
        if (!rc) L->n_expert = (int)t->ne[2];
    }
    for (int l = 0; !rc && l < s->n_layers; l++) {
        rc = check_layer(&s->layers[l], l, path, err);
        for (int p = 0; !rc && p < EM_EXPERT_NPARTS; p++)
            s->total += s->layers[l].part_bytes[p] * (uint64_t)s->layers[l].n_expert;
    }
    s->n_shards = em_gguf_n_shards(g);
    if (!rc) {
        s->paths = em_calloc((size_t)s->n_shards, sizeof *s->paths, "expert shard paths", err);
        if (!s->paths) rc = EM_ENOMEM;
    }
    for (int i = 0; !rc && i < s->n_shards; i++) {
        s->paths[i] = em_strdup(em_gguf_shard_at(g, i)->path, err);
        if (!s->paths[i]) rc = EM_ENOMEM;
    }
    if (rc) {
        em_expert_store_close(s);
        return rc;
    }
    *out = s;
    return EM_OK;
}

void em_expert_store_close(em_expert_store *s) {
    if (!s) return;
    for (int i = 0; s->paths && i < s->n_shards; i++) free(s->paths[i]);
    free(s->paths);
    free(s->layers);
    free(s);
}

int em_expert_store_n_layers(const em_expert_store *s) { return s->n_layers; }

const em_expert_layer *em_expert_store_layer(const em_expert_store *s, int layer) {
    return layer >= 0 && layer < s->n_layers ? &s->layers[layer] : NULL;
}

int em_expert_store_n_shards(const em_expert_store *s) { return s->n_shards; }

const char *em_expert_store_shard_path(const em_expert_store *s, int shard) {
    return shard >= 0 && shard < s->n_shards ? s->paths[shard] : NULL;
}

int em_expert_store_range(const em_expert_store *s, int layer, int expert, int part,
                          em_expert_range *out, em_err *err) {
    const em_expert_layer *L = em_expert_store_layer(s, layer);
    if (!L || expert < 0 || expert >= L->n_expert || part < 0 || part >= EM_EXPERT_NPARTS)
        return em_err_set(err, EM_EINVAL, "expert (layer %d, expert %d, part %d) does not exist",
                          layer, expert, part);
    /* in range: base + n_expert * part_bytes was checked against the tensor at open */
    out->shard = L->shard[part];
    out->bytes = L->part_bytes[part];
    out->offset = L->base[part] + (uint64_t)expert * L->part_bytes[part];
    return EM_OK;
}

uint64_t em_expert_store_total_bytes(const em_expert_store *s) { return s->total; }

uint64_t em_experts_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    return found && kib < (UINT64_MAX >> 10) ? (uint64_t)kib << 10 : 0;
}
