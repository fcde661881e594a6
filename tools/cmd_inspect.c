/* `ember inspect FILE.gguf [--json]`: every metadata key (type and value) and every tensor
 * (type, shape, shard, offset, bytes) of a GGUF model, all shards of a split model included.
 * The human form summarizes long values; --json prints one JSON object in the format agreed
 * in the brief (file order, exact integers, f32 as %.9g, f64 as %.17g, non-finite numbers as
 * the strings "nan"/"inf"/"-inf", bytes that are not UTF-8 as \u00XX of the byte).
 * Reads only; all output goes to stdout, errors to stderr. */
#include "cli.h"

#include "format/gguf.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char inspect_usage[] =
    "usage: ember inspect FILE.gguf [--json]\n"
    "\n"
    "Prints the metadata and tensors of a GGUF file. For a split model (NAME-00001-of-0000N.gguf)\n"
    "any shard opens the whole model.\n"
    "\n"
    "  --json    print one JSON object instead of text\n";

/* ---- UTF-8 and JSON strings ----------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at p (n bytes available), 0 if there is none. */
static int utf8_len(const unsigned char *p, uint64_t n) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    int len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    if ((uint64_t)len > n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return len;
}

static void json_str(FILE *o, const char *s, uint64_t len) {
    const unsigned char *p = (const unsigned char *)s;
    putc('"', o);
    for (uint64_t i = 0; i < len;) {
        unsigned char c = p[i];
        int n = utf8_len(p + i, len - i);
        if (n == 0) {
            fprintf(o, "\\u%04x", c); /* not UTF-8: the byte as a code point (lossy) */
            i++;
        } else if (n > 1) {
            fwrite(p + i, 1, (size_t)n, o);
            i += (uint64_t)n;
        } else {
            switch (c) {
            case '"': fputs("\\\"", o); break;
            case '\\': fputs("\\\\", o); break;
            case '\n': fputs("\\n", o); break;
            case '\r': fputs("\\r", o); break;
            case '\t': fputs("\\t", o); break;
            case '\b': fputs("\\b", o); break;
            case '\f': fputs("\\f", o); break;
            default:
                if (c < 0x20) fprintf(o, "\\u%04x", c);
                else putc(c, o);
            }
            i++;
        }
    }
    putc('"', o);
}

static void json_cstr(FILE *o, const char *s) { json_str(o, s, strlen(s)); }

static void json_double(FILE *o, double v, int digits) {
    if (isnan(v)) fputs("\"nan\"", o);
    else if (isinf(v)) fputs(v > 0 ? "\"inf\"" : "\"-inf\"", o);
    else fprintf(o, "%.*g", digits, v);
}

static void json_array_items(FILE *o, const em_gguf_arr *a);

static void json_value(FILE *o, const em_gguf_value *v) {
    switch (v->type) {
    case EM_GGUF_U8: case EM_GGUF_U16: case EM_GGUF_U32: case EM_GGUF_U64:
        fprintf(o, "%" PRIu64, v->u);
        break;
    case EM_GGUF_I8: case EM_GGUF_I16: case EM_GGUF_I32: case EM_GGUF_I64:
        fprintf(o, "%" PRId64, v->i);
        break;
    case EM_GGUF_F32: json_double(o, v->f32, 9); break;
    case EM_GGUF_F64: json_double(o, v->f64, 17); break;
    case EM_GGUF_BOOL: fputs(v->b ? "true" : "false", o); break;
    case EM_GGUF_STR: json_str(o, v->str.ptr, v->str.len); break;
    case EM_GGUF_ARRAY: json_array_items(o, v->arr); break;
    default: fputs("null", o);
    }
}

/* [items]; an item that is itself an array is {"elem_type": T, "value": [...]}. */
static void json_array_items(FILE *o, const em_gguf_arr *a) {
    uint64_t n = em_gguf_arr_count(a);
    putc('[', o);
    for (uint64_t i = 0; i < n; i++) {
        em_gguf_value e = em_gguf_arr_at(a, i);
        if (i) fputs(", ", o);
        if (e.type == EM_GGUF_ARRAY) {
            fprintf(o, "{\"elem_type\": \"%s\", \"value\": ", em_gguf_type_name(em_gguf_arr_type(e.arr)));
            json_array_items(o, e.arr);
            putc('}', o);
        } else {
            json_value(o, &e);
        }
    }
    putc(']', o);
}

static void print_json(FILE *o, const em_gguf *g) {
    fputs("{\"file\": ", o);
    json_cstr(o, em_gguf_path(g));
    fprintf(o, ", \"version\": %u, \"alignment\": %u, \"n_shards\": %d,\n \"metadata\": [",
            em_gguf_version(g), em_gguf_alignment(g), em_gguf_n_shards(g));
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        em_gguf_value v = em_gguf_value_at(g, i);
        fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", o);
        json_cstr(o, em_gguf_key(g, i));
        fprintf(o, ", \"type\": \"%s\"", em_gguf_type_name(v.type));
        if (v.type == EM_GGUF_ARRAY)
            fprintf(o, ", \"elem_type\": \"%s\"", em_gguf_type_name(em_gguf_arr_type(v.arr)));
        fputs(", \"value\": ", o);
        json_value(o, &v);
        putc('}', o);
    }
    fputs("],\n \"tensors\": [", o);
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", o);
        json_cstr(o, t->name);
        fprintf(o, ", \"type\": \"%s\", \"type_id\": %d, \"shape\": [", em_type_name(t->type), t->type);
        for (int d = 0; d < t->n_dims; d++) fprintf(o, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        fprintf(o, "], \"shard\": %d, \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", t->shard,
                t->offset, t->bytes);
    }
    fputs("]}\n", o);
}

/* ---- human form ------------------------------------------------------------------------ */

/* A quoted string, C-escaped, cut after max bytes. */
static void human_str(FILE *o, const char *s, uint64_t len, uint64_t max) {
    const unsigned char *p = (const unsigned char *)s;
    uint64_t i = 0;
    putc('"', o);
    while (i < len && i < max) {
        int n = utf8_len(p + i, len - i);
        if (n > 1) {
            if (i + (uint64_t)n > max) break;
            fwrite(p + i, 1, (size_t)n, o);
            i += (uint64_t)n;
            continue;
        }
        unsigned char c = p[i++];
        if (c == '"' || c == '\\') fprintf(o, "\\%c", c);
        else if (c == '\n') fputs("\\n", o);
        else if (c == '\t') fputs("\\t", o);
        else if (c < 0x20 || c >= 0x7f) fprintf(o, "\\x%02x", c);
        else putc(c, o);
    }
    putc('"', o);
    if (i < len) fprintf(o, "... (%" PRIu64 " bytes)", len);
}

static void human_value(FILE *o, const em_gguf_value *v, int depth);

static void human_array(FILE *o, const em_gguf_arr *a, int depth) {
    uint64_t n = em_gguf_arr_count(a), show = depth == 0 ? 8 : 3;
    fprintf(o, "[%" PRIu64 " %s]", n, em_gguf_type_name(em_gguf_arr_type(a)));
    for (uint64_t i = 0; i < n && i < show; i++) {
        em_gguf_value e = em_gguf_arr_at(a, i);
        fputs(i ? ", " : " ", o);
        if (e.type == EM_GGUF_ARRAY) putc('{', o);
        human_value(o, &e, depth + 1);
        if (e.type == EM_GGUF_ARRAY) putc('}', o);
    }
    if (n > show) fputs(", ...", o);
}

static void human_value(FILE *o, const em_gguf_value *v, int depth) {
    switch (v->type) {
    case EM_GGUF_F32: fprintf(o, "%.9g", (double)v->f32); break;
    case EM_GGUF_F64: fprintf(o, "%.17g", v->f64); break;
    case EM_GGUF_STR: human_str(o, v->str.ptr, v->str.len, depth == 0 ? 160 : 40); break;
    case EM_GGUF_ARRAY: human_array(o, v->arr, depth); break;
    default: json_value(o, v); /* integers and booleans read the same */
    }
}

static void print_human(FILE *o, const em_gguf *g) {
    int64_t n_keys = em_gguf_n_keys(g), n_tensors = em_gguf_n_tensors(g);
    int n_shards = em_gguf_n_shards(g);
    fprintf(o, "%s: GGUF v%u, alignment %u, %d shard%s, %" PRId64 " keys, %" PRId64 " tensors\n",
            em_gguf_path(g), em_gguf_version(g), em_gguf_alignment(g), n_shards,
            n_shards == 1 ? "" : "s", n_keys, n_tensors);
    for (int s = 0; n_shards > 1 && s < n_shards; s++) {
        const em_gguf_shard *sh = em_gguf_shard_at(g, s);
        fprintf(o, "  shard %d: %s (%" PRIu64 " bytes, %" PRId64 " tensor%s)\n", s, sh->path,
                sh->file_size, sh->n_tensors, sh->n_tensors == 1 ? "" : "s");
    }
    int width = 8;
    for (int64_t i = 0; i < n_keys; i++) {
        int len = (int)strlen(em_gguf_key(g, i));
        if (len > width) width = len < 48 ? len : 48;
    }
    fprintf(o, "\nmetadata:\n");
    for (int64_t i = 0; i < n_keys; i++) {
        em_gguf_value v = em_gguf_value_at(g, i);
        fprintf(o, "  %-*s %-5s ", width, em_gguf_key(g, i), em_gguf_type_name(v.type));
        human_value(o, &v, 0);
        putc('\n', o);
    }
    width = 8;
    for (int64_t i = 0; i < n_tensors; i++) {
        int len = (int)strlen(em_gguf_tensor_at(g, i)->name);
        if (len > width) width = len;
    }
    fprintf(o, "\ntensors:\n");
    uint64_t bytes = 0, elements = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        char shape[128];
        int n = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->n_dims; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        snprintf(shape + n, sizeof shape - (size_t)n, "]");
        fprintf(o, "  %-*s %-7s %-24s shard %d  offset %" PRIu64 "  bytes %" PRIu64 "\n", width,
                t->name, em_type_name(t->type), shape, t->shard, t->offset, t->bytes);
        bytes += t->bytes;
        elements += t->n_elements;
    }
    char size[32];
    fprintf(o, "\ntotal: %" PRId64 " tensors, %" PRIu64 " elements, %" PRIu64
               " bytes (%s) of tensor data in %d shard%s; %" PRId64 " keys\n",
            n_tensors, elements, bytes, em_format_size(bytes, size, sizeof size), n_shards,
            n_shards == 1 ? "" : "s", n_keys);
}

/* ---- the command ----------------------------------------------------------------------- */

static int inspect_main(int argc, char **argv) {
    const char *path = NULL;
    bool json = false, flags_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!flags_done && !strcmp(a, "--")) flags_done = true;
        else if (!flags_done && !strcmp(a, "--json")) json = true;
        else if (!flags_done && a[0] == '-' && a[1])
            return em_cli_usage_error(&em_cmd_inspect, "unknown flag '%s'", a);
        else if (path)
            return em_cli_usage_error(&em_cmd_inspect, "unexpected argument '%s'", a);
        else path = a;
    }
    if (!path) return em_cli_usage_error(&em_cmd_inspect, "missing FILE.gguf");
    em_err err = { 0 };
    em_gguf *g;
    /* metadata and tensor infos only: a file cut short still shows them, with a warning */
    if (em_gguf_open_ex(&g, path, &(em_gguf_open_opts){ .allow_missing_data = true }, &err))
        return em_cli_fail(&em_cmd_inspect, &err);
    int64_t n_missing = 0;
    const em_gguf_tensor *first = NULL;
    uint64_t lost = em_gguf_missing(g, &n_missing, &first);
    if (first)
        em_log(EM_LOG_WARN, "%s: tensor data is missing: the file is %llu bytes short (%lld tensors, the first '%s')",
               path, (unsigned long long)lost, (long long)n_missing, first->name);
    if (json) print_json(stdout, g);
    else print_human(stdout, g);
    em_gguf_close(g);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        em_err_set(&err, EM_EIO, "writing to stdout failed");
        return em_cli_fail(&em_cmd_inspect, &err);
    }
    return EM_EXIT_OK;
}

const em_cmd em_cmd_inspect = {
    .name = "inspect",
    .summary = "print a GGUF file's metadata and tensors",
    .usage = inspect_usage,
    .main = inspect_main,
};
