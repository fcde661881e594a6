/* convert/report.c: the validation report of a conversion, as JSON (jansson, keys in a fixed
 * order) and as text; writing the JSON file atomically (temporary file, fsync, rename).
 * Field names are documented in docs/convert.md; tests read them, so they are stable. */
#include "convert/convert_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void em_convert_report_free(em_convert_report *rep) {
    if (!rep) return;
    for (int i = 0; i < rep->n_shards; i++) free(rep->shards[i].path);
    free(rep->shards);
    free(rep->quant);
    rep->shards = NULL;
    rep->quant = NULL;
    rep->n_shards = rep->n_quant = 0;
}

static json_t *json_u64(uint64_t v) { return json_integer((json_int_t)v); }

static json_t *types_json(const em_convert_report *rep) {
    json_t *o = json_object();
    for (int t = 0; t < EM_TYPE_COUNT; t++)
        if (rep->type_counts[t]) json_object_set_new(o, em_type_name(t), json_integer(rep->type_counts[t]));
    return o;
}

static json_t *quant_json(const em_convert_report *rep) {
    json_t *q = json_object(), *list = json_array();
    json_object_set_new(q, "count", json_integer(rep->n_quant));
    json_object_set_new(q, "sample_rows", json_integer(rep->rmse_rows));
    json_object_set_new(q, "rel_rmse_rms", json_real(rep->rmse_rms));
    if (rep->worst >= 0) {
        json_t *w = json_object();
        json_object_set_new(w, "name", json_string(rep->quant[rep->worst].name));
        json_object_set_new(w, "rel_rmse", json_real(rep->quant[rep->worst].rel_rmse));
        json_object_set_new(q, "worst", w);
    } else {
        json_object_set_new(q, "worst", json_null());
    }
    for (int i = 0; i < rep->n_quant; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "name", json_string(rep->quant[i].name));
        json_object_set_new(e, "type", json_string(em_type_name(rep->quant[i].type)));
        json_object_set_new(e, "rel_rmse", json_real(rep->quant[i].rel_rmse));
        json_object_set_new(e, "rows", json_u64(rep->quant[i].rows));
        json_array_append_new(list, e);
    }
    json_object_set_new(q, "tensors", list);
    return q;
}

static json_t *shards_json(const em_convert_report *rep) {
    json_t *a = json_array();
    for (int i = 0; i < rep->n_shards; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "path", json_string(rep->shards[i].path));
        json_object_set_new(e, "bytes", json_u64(rep->shards[i].bytes));
        json_object_set_new(e, "sha256", json_string(rep->shards[i].sha256));
        json_array_append_new(a, e);
    }
    return a;
}

static json_t *report_json(const em_convert_report *rep) {
    json_t *o = json_object();
    json_object_set_new(o, "source", json_string(rep->src_dir));
    json_object_set_new(o, "output", json_string(rep->n_shards ? rep->shards[0].path : ""));
    json_object_set_new(o, "architecture", json_string(rep->arch));
    json_object_set_new(o, "mode", json_string(rep->mode));
    json_object_set_new(o, "layout", json_string(rep->layout));
    json_object_set_new(o, "markov_head", json_string(rep->markov));
    json_object_set_new(o, "type", json_string(em_type_name(rep->type)));
    json_object_set_new(o, "policy", json_string(em_convert_policy(rep->type)));
    json_object_set_new(o, "parameters", json_u64(rep->n_params));
    json_object_set_new(o, "source_tensors", json_integer(rep->n_src_tensors));
    json_object_set_new(o, "source_tensors_mapped", json_integer(rep->n_src_mapped));
    json_object_set_new(o, "source_tensors_dropped", json_integer(rep->n_src_dropped));
    json_object_set_new(o, "source_tensors_skipped", json_integer(rep->n_src_skipped));
    json_object_set_new(o, "gguf_tensors", json_integer(rep->n_out_tensors));
    json_object_set_new(o, "source_bytes", json_u64(rep->src_bytes));
    json_object_set_new(o, "source_tensor_bytes", json_u64(rep->src_tensor_bytes));
    json_object_set_new(o, "output_bytes", json_u64(rep->out_bytes));
    json_object_set_new(o, "ratio", json_real(rep->ratio));
    json_object_set_new(o, "tensor_types", types_json(rep));
    json_object_set_new(o, "quantization", quant_json(rep));
    json_object_set_new(o, "sha256", json_string(rep->n_shards ? rep->shards[0].sha256 : ""));
    json_object_set_new(o, "shards", shards_json(rep));
    json_object_set_new(o, "tokenizer", json_string(rep->tokenizer));
    json_object_set_new(o, "tokenizer_dir", json_string(rep->tokenizer_dir));
    json_object_set_new(o, "chat_template", json_string(rep->chat_template));
    json_object_set_new(o, "tokens", json_integer(rep->n_tokens));
    json_object_set_new(o, "threads", json_integer(rep->n_threads));
    json_object_set_new(o, "seconds", json_real(rep->seconds));
    json_object_set_new(o, "note", json_string(rep->note));
    return o;
}

int em_convert_report_json(const em_convert_report *rep, char **json, em_err *err) {
    json_t *o = report_json(rep);
    *json = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (!*json) return em_err_set(err, EM_ENOMEM, "convert report: out of memory");
    return EM_OK;
}

int em_cv_report_stage(const em_convert_report *rep, const char *path, char **tmp_out,
                       em_err *err) {
    *tmp_out = NULL;
    char *json;
    int rc = em_convert_report_json(rep, &json, err);
    if (rc) return rc;
    size_t cap = strlen(path) + 32;
    char *tmp = em_malloc(cap, "path", err);
    if (!tmp) {
        free(json);
        return EM_ENOMEM;
    }
    snprintf(tmp, cap, "%s.partial.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) rc = em_err_set(err, EM_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    if (!rc) rc = em_write_full(fd, json, strlen(json), tmp, err);
    if (!rc) rc = em_write_full(fd, "\n", 1, tmp, err);
    if (!rc && fsync(fd) != 0) rc = em_err_set(err, EM_EIO, "%s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = em_err_set(err, EM_EIO, "%s: close: %s", tmp, strerror(errno));
    if (rc && fd >= 0) unlink(tmp);
    free(json);
    if (rc) free(tmp);
    else *tmp_out = tmp;
    return rc;
}

int em_convert_report_write(const em_convert_report *rep, const char *path, em_err *err) {
    char *tmp;
    int rc = em_cv_report_stage(rep, path, &tmp, err);
    if (!rc && rename(tmp, path) != 0) {
        rc = em_err_set(err, EM_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

void em_convert_report_print(const em_convert_report *rep, FILE *f) {
    char a[32], b[32];
    fprintf(f, "converted %s -> %s\n", rep->src_dir, rep->n_shards ? rep->shards[0].path : "-");
    fprintf(f, "  architecture   %s%s%s%s%s (layout %s)\n", rep->arch, rep->mode[0] ? ", mode " : "",
            rep->mode, rep->markov[0] && strcmp(rep->markov, "none") ? ", markov head " : "",
            rep->markov[0] && strcmp(rep->markov, "none") ? rep->markov : "", rep->layout);
    fprintf(f, "  type           %s (%s)\n", em_type_name(rep->type), em_convert_policy(rep->type));
    if (rep->note[0]) fprintf(f, "  note           %s\n", rep->note);
    fprintf(f, "  parameters     %llu\n", (unsigned long long)rep->n_params);
    fprintf(f, "  tensors        %lld of %lld source tensors mapped", (long long)rep->n_src_mapped,
            (long long)rep->n_src_tensors);
    if (rep->n_src_dropped) fprintf(f, ", %lld training-only dropped", (long long)rep->n_src_dropped);
    if (rep->n_src_skipped)
        fprintf(f, ", %lld skipped (vision tower / projector: text only)", (long long)rep->n_src_skipped);
    fprintf(f, "; %lld GGUF tensors (", (long long)rep->n_out_tensors);
    const char *sep = "";
    for (int t = 0; t < EM_TYPE_COUNT; t++)
        if (rep->type_counts[t]) {
            fprintf(f, "%s%lld %s", sep, (long long)rep->type_counts[t], em_type_name(t));
            sep = " + ";
        }
    fprintf(f, ")\n");
    fprintf(f, "  bytes          %llu source (%s) -> %llu GGUF (%s), %.2f%%\n",
            (unsigned long long)rep->src_bytes, em_format_size(rep->src_bytes, a, sizeof a),
            (unsigned long long)rep->out_bytes, em_format_size(rep->out_bytes, b, sizeof b),
            100.0 * rep->ratio);
    if (rep->n_quant)
        fprintf(f, "  rel. RMSE      RMS %.5f over %d tensors (%d rows each at most); worst %s %.5f\n",
                rep->rmse_rms, rep->n_quant, rep->rmse_rows, rep->quant[rep->worst].name,
                rep->quant[rep->worst].rel_rmse);
    fprintf(f, "  tokenizer      %s", rep->tokenizer);
    if (rep->n_tokens) fprintf(f, ", %lld tokens from %s", (long long)rep->n_tokens, rep->tokenizer_dir);
    if (rep->chat_template[0]) fprintf(f, "; chat template: %s", rep->chat_template);
    fprintf(f, "\n");
    for (int i = 0; i < rep->n_shards; i++)
        fprintf(f, "  sha256         %s  %s\n", rep->shards[i].sha256, rep->shards[i].path);
    fprintf(f, "  time           %.2f s on %d threads\n", rep->seconds, rep->n_threads);
}
