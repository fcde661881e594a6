/* `ember tokenize -m MODEL.gguf [-p TEXT | -f FILE]`: the token ids of a text, comma-separated
 * on one line, through the model's own tokenizer (text/); `--ids LIST` goes the other way and
 * prints the exact bytes the ids decode to. Reads only the tokenizer keys of the model. */
#include "cli.h"

#include "format/gguf.h"
#include "text/text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char tokenize_usage[] =
    "usage: ember tokenize -m MODEL.gguf [-p TEXT | -f FILE] [flags]\n"
    "       ember tokenize -m MODEL.gguf --ids LIST [--skip-special]\n"
    "\n"
    "Prints the token ids of TEXT (valid UTF-8), comma-separated on one line. Special-token\n"
    "text such as <|im_end|> becomes that token; BOS/EOS are added only when the model's\n"
    "tokenizer asks for them (tokenizer.ggml.add_bos_token).\n"
    "\n"
    "  -m, --model FILE     the GGUF model (only its tokenizer keys are read)\n"
    "  -p, --prompt TEXT    the text\n"
    "  -f, --file FILE      the text, read from FILE\n"
    "      --chat           wrap the text as one user message in Kimi's chat format, with\n"
    "                       the assistant generation prompt after it\n"
    "      --no-special     special-token text stays plain text\n"
    "      --no-add-special never add BOS/EOS\n"
    "      --pieces         one token per line: the id, a tab, its bytes (C-style escapes)\n"
    "      --ranks R        how BPE ranks pairs: merges (llama.cpp's way) or tiktoken (Kimi's\n"
    "                       own tokenizer); default: tiktoken for kimi-k2 vocabularies whose\n"
    "                       ids are tiktoken ranks, else merges\n"
    "      --ids LIST       decode instead: write exactly the bytes the ids stand for (no\n"
    "                       newline added); LIST is 1,2,3 or @FILE holding that text\n"
    "      --skip-special   with --ids: control tokens decode to nothing\n";

typedef struct tok_opts {
    const char *model, *prompt, *file, *ids;
    bool chat, no_special, no_add_special, pieces, skip_special;
    int ranks;
} tok_opts;

/* Parses "1,2,3" (spaces and newlines around the numbers allowed) into a new array. */
static int parse_ids(const char *text, int32_t **ids, size_t *n, em_err *err) {
    size_t cap = 16, count = 0;
    int32_t *v = em_malloc(cap * sizeof *v, "ids", err);
    if (!v) return EM_ENOMEM;
    const char *p = text;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    while (*p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return em_err_set(err, EM_EINVAL, "--ids: '%.20s' is not a token id", p);
        }
        if (count == cap) {
            int32_t *w = realloc(v, 2 * cap * sizeof *v);
            if (!w) {
                free(v);
                return em_err_set(err, EM_ENOMEM, "--ids: out of memory");
            }
            v = w;
            cap *= 2;
        }
        v[count++] = (int32_t)x;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (*p == ',') {
            p++;
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
        } else if (*p) {
            free(v);
            return em_err_set(err, EM_EINVAL, "--ids: expected ',' at '%.20s'", p);
        }
    }
    *ids = v;
    *n = count;
    return EM_OK;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t valid = em_utf8_valid_prefix(s + i, n - i < 4 ? n - i : 4);
        if (c >= 0x80 && valid > 0) { /* a whole valid sequence */
            size_t seq = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            fwrite(s + i, 1, seq, stdout);
            i += seq;
            continue;
        }
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c >= 0x7F) printf("\\x%02X", c);
        else putchar(c);
        i++;
    }
}

static int run_decode(const em_tok *t, const tok_opts *o, em_err *err) {
    char *list = NULL;
    size_t len;
    int rc = EM_OK;
    if (o->ids[0] == '@') rc = em_file_read_all(o->ids + 1, &list, &len, err);
    if (rc) return rc;
    int32_t *ids = NULL;
    size_t n = 0;
    rc = parse_ids(list ? list : o->ids, &ids, &n, err);
    free(list);
    if (rc) return rc;
    char *text;
    rc = em_tok_decode(t, ids, n, o->skip_special ? EM_TOK_SKIP_SPECIAL : 0, &text, &len, err);
    free(ids);
    if (rc) return rc;
    fwrite(text, 1, len, stdout);
    free(text);
    return EM_OK;
}

static int run_encode(const em_tok *t, const tok_opts *o, em_err *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = EM_OK;
    if (o->file) rc = em_file_read_all(o->file, &text, &len, err);
    if (rc) return rc;
    const char *src = o->file ? text : o->prompt;
    if (!o->file) len = strlen(src);
    int32_t *ids = NULL;
    size_t n = 0;
    if (o->chat) {
        if (memchr(src, '\0', len)) rc = em_err_set(err, EM_EINVAL, "--chat: the text holds a NUL byte");
        em_chat_msg m = { .role = "user", .content = src };
        if (!rc) rc = em_chat_encode_kimi(t, &m, 1, true, &ids, &n, err);
    } else {
        unsigned flags = (o->no_special ? 0 : EM_TOK_PARSE_SPECIAL) | (o->no_add_special ? 0 : EM_TOK_ADD_SPECIAL);
        rc = em_tok_encode(t, src, len, flags, &ids, &n, err);
    }
    if (rc && o->file) em_err_prefix(err, "%s", o->file);
    free(text);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        if (o->pieces) {
            size_t plen;
            const char *piece = em_tok_piece(t, ids[i], &plen);
            printf("%d\t", ids[i]);
            print_escaped(piece, plen);
            putchar('\n');
        } else {
            printf(i ? ",%d" : "%d", ids[i]);
        }
    }
    if (!o->pieces) putchar('\n');
    free(ids);
    return EM_OK;
}

static int parse_args(int argc, char **argv, tok_opts *o) {
    const em_cmd *cmd = &em_cmd_tokenize;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **value = NULL;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) value = &o->model;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) value = &o->prompt;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) value = &o->file;
        else if (!strcmp(a, "--ids")) value = &o->ids;
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--no-special")) o->no_special = true;
        else if (!strcmp(a, "--no-add-special")) o->no_add_special = true;
        else if (!strcmp(a, "--pieces")) o->pieces = true;
        else if (!strcmp(a, "--skip-special")) o->skip_special = true;
        else if (!strcmp(a, "--ranks")) {
            if (i + 1 >= argc) return em_cli_usage_error(cmd, "--ranks needs merges or tiktoken");
            const char *r = argv[++i];
            if (!strcmp(r, "merges")) o->ranks = EM_TOK_RANKS_MERGES;
            else if (!strcmp(r, "tiktoken")) o->ranks = EM_TOK_RANKS_TIKTOKEN;
            else return em_cli_usage_error(cmd, "--ranks: '%s' is not merges or tiktoken", r);
        } else if (a[0] == '-') return em_cli_usage_error(cmd, "unknown flag '%s'", a);
        else return em_cli_usage_error(cmd, "unexpected argument '%s'", a);
        if (value) {
            if (i + 1 >= argc) return em_cli_usage_error(cmd, "%s needs a value", a);
            *value = argv[++i];
        }
    }
    if (!o->model) return em_cli_usage_error(cmd, "missing -m MODEL.gguf");
    int sources = (o->prompt != NULL) + (o->file != NULL) + (o->ids != NULL);
    if (sources != 1) return em_cli_usage_error(cmd, "give exactly one of -p TEXT, -f FILE, --ids LIST");
    if (o->ids && (o->chat || o->pieces || o->no_special || o->no_add_special))
        return em_cli_usage_error(cmd, "--ids takes only --skip-special");
    if (o->chat && (o->no_special || o->no_add_special))
        return em_cli_usage_error(cmd, "--chat encodes the chat format as it is: no --no-special");
    return -1;
}

static int tokenize_main(int argc, char **argv) {
    tok_opts o = { 0 };
    int usage = parse_args(argc, argv, &o);
    if (usage >= 0) return usage;
    em_err err = { 0 };
    em_gguf *g;
    if (em_gguf_open(&g, o.model, &err)) return em_cli_fail(&em_cmd_tokenize, &err);
    em_tok *t;
    em_tok_opts topts = { .ranks = o.ranks };
    int rc = em_tok_create(&t, g, &topts, &err);
    em_gguf_close(g);
    if (rc) return em_cli_fail(&em_cmd_tokenize, &err);
    rc = o.ids ? run_decode(t, &o, &err) : run_encode(t, &o, &err);
    em_tok_free(t);
    if (!rc && (fflush(stdout) != 0 || ferror(stdout)))
        rc = em_err_set(&err, EM_EIO, "writing to standard output failed");
    return rc ? em_cli_fail(&em_cmd_tokenize, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_tokenize = {
    .name = "tokenize",
    .summary = "token ids of a text (or the text of ids) through a model's tokenizer",
    .usage = tokenize_usage,
    .main = tokenize_main,
};
