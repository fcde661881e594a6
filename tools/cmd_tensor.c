/* `ember tensor FILE.gguf NAME -o OUT.f32`: one tensor dequantized to raw little-endian f32,
 * ne[0] fastest (the order ggml stores it in). Works through the tensor a block of rows at a
 * time, so memory stays small whatever the tensor's size; a failed run removes OUT. */
#include "cli.h"

#include "format/gguf.h"
#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char tensor_usage[] =
    "usage: ember tensor FILE.gguf NAME -o OUT.f32\n"
    "\n"
    "Writes tensor NAME of a GGUF model, dequantized, to OUT.f32 as little-endian f32 values,\n"
    "ne[0] fastest.\n"
    "\n"
    "  -o, --output OUT    the file to write (required)\n";

#define CHUNK_ELEMS (1u << 20) /* values dequantized per step (4 MiB of f32) */

static int dump_tensor(const em_gguf *g, const em_gguf_tensor *t, int fd, const char *out,
                       em_err *err) {
    const em_type_info *ti = em_type_get(t->type);
    if (!ti || !ti->to_float)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor '%s' has type %s, which Ember cannot "
                          "dequantize", em_gguf_path(g), t->name, em_type_name(t->type));
    if (t->n_elements == 0) return EM_OK;
    uint64_t row = (uint64_t)t->ne[0]; /* ne[0] >= 1 here: n_elements > 0 */
    uint64_t rows = t->n_elements / row, row_bytes = t->bytes / rows;
    uint64_t step = CHUNK_ELEMS / row ? CHUNK_ELEMS / row : 1; /* rows per step */
    float *buf = em_malloc((size_t)(step * row) * sizeof *buf, "dequantized rows", err);
    if (!buf) return EM_ENOMEM;
    int rc = EM_OK;
    const uint8_t *src = t->data;
    for (uint64_t r = 0; r < rows && !rc; r += step) {
        uint64_t k = rows - r < step ? rows - r : step;
        rc = em_dequantize(t->type, src + r * row_bytes, buf, (int64_t)(k * row), err);
        if (rc) em_err_prefix(err, "%s: tensor '%s'", em_gguf_path(g), t->name);
        else rc = em_write_full(fd, buf, (size_t)(k * row) * sizeof *buf, out, err);
    }
    free(buf);
    return rc;
}

static int tensor_main(int argc, char **argv) {
    const char *args[2] = { NULL, NULL }, *out = NULL;
    int n_args = 0;
    bool flags_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!flags_done && !strcmp(a, "--")) flags_done = true;
        else if (!flags_done && (!strcmp(a, "-o") || !strcmp(a, "--output"))) {
            if (i + 1 >= argc) return em_cli_usage_error(&em_cmd_tensor, "%s needs a file name", a);
            out = argv[++i];
        } else if (!flags_done && a[0] == '-' && a[1])
            return em_cli_usage_error(&em_cmd_tensor, "unknown flag '%s'", a);
        else if (n_args == 2)
            return em_cli_usage_error(&em_cmd_tensor, "unexpected argument '%s'", a);
        else args[n_args++] = a;
    }
    if (n_args < 2) return em_cli_usage_error(&em_cmd_tensor, "missing %s", n_args ? "NAME" : "FILE.gguf and NAME");
    if (!out) return em_cli_usage_error(&em_cmd_tensor, "missing -o OUT.f32");

    em_err err = { 0 };
    em_gguf *g;
    const em_gguf_tensor *t;
    if (em_gguf_open(&g, args[0], &err)) return em_cli_fail(&em_cmd_tensor, &err);
    if (em_gguf_get_tensor(g, args[1], &t, &err)) {
        em_gguf_close(g);
        return em_cli_fail(&em_cmd_tensor, &err);
    }
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    int rc = fd < 0 ? em_err_set(&err, EM_EIO, "%s: cannot create: %s", out, strerror(errno))
                    : dump_tensor(g, t, fd, out, &err);
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = em_err_set(&err, EM_EIO, "%s: close failed: %s", out, strerror(errno));
    if (rc && fd >= 0) unlink(out);
    em_gguf_close(g);
    return rc ? em_cli_fail(&em_cmd_tensor, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_tensor = {
    .name = "tensor",
    .summary = "dequantize one tensor of a GGUF file to raw f32",
    .usage = tensor_usage,
    .main = tensor_main,
};
