/* convert/outputs.c: where a conversion's files go, and when they appear.
 *
 * Owns two guarantees of em_convert:
 *   - all or nothing: the GGUF (every shard) is written under a staging name next to its final
 *     name, the JSON report under a temporary name next to its own; only when every file is
 *     complete are they renamed into place, so a failure at any step (the report's folder does
 *     not exist, a disk fills up, a signal) leaves whatever was at the final names untouched and
 *     removes every staged file;
 *   - no output overwrites an input or another output: the GGUF (each final shard name) and the
 *     report are compared with each other and with every file the conversion reads, by identity
 *     (st_dev + st_ino when the file exists, which sees through symbolic and hard links; else the
 *     identity of the parent folder plus the name), before anything is written and again before
 *     the renames (split shard names are known only then).
 * Invariant: a staged name is the final name with STAGE_TAG + pid inserted after the stem
 * (before ".gguf" and before the shard suffix), so final names are recovered by removing it. */
#include "convert/convert_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STAGE_TAG ".staged-"

/* ---- path identity ----------------------------------------------------------------------- */

/* The folder holding path, into dir[4096] ("." for a bare name); returns dir. */
static char *parent_dir(const char *path, char *dir) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, 4096, ".");
    else snprintf(dir, 4096, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return dir;
}

typedef struct path_id {
    bool exists, parent_ok;
    dev_t dev, pdev;
    ino_t ino, pino;
    const char *base;
} path_id;

static path_id identify(const char *path) {
    path_id id = { 0 };
    struct stat sb;
    if (stat(path, &sb) == 0) {
        id.exists = true;
        id.dev = sb.st_dev;
        id.ino = sb.st_ino;
    }
    const char *slash = strrchr(path, '/');
    id.base = slash ? slash + 1 : path;
    char dir[4096];
    if (stat(parent_dir(path, dir), &sb) == 0) {
        id.parent_ok = true;
        id.pdev = sb.st_dev;
        id.pino = sb.st_ino;
    }
    return id;
}

/* Whether two paths name the same file (existing or to be created). */
static bool same_file(const char *a, const char *b) {
    path_id x = identify(a), y = identify(b);
    if (x.exists && y.exists) return x.dev == y.dev && x.ino == y.ino;
    if (x.parent_ok && y.parent_ok)
        return x.pdev == y.pdev && x.pino == y.pino && strcmp(x.base, y.base) == 0;
    return strcmp(a, b) == 0;
}

/* Files of dir that a conversion may read (config, index, tokenizer, chat template). */
static const char *const k_read_names[] = {
    "config.json",    "model.safetensors.index.json", "tokenizer.json", "tiktoken.model",
    "tokenizer_config.json", "chat_template.jinja",   "chat_template.json",
};

static int refuse_in_dir(const char *what, const char *out, const char *dir, em_err *err) {
    char path[4096];
    for (size_t i = 0; dir && i < sizeof k_read_names / sizeof k_read_names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, k_read_names[i]);
        if (em_file_exists(path) && same_file(out, path))
            return em_err_set(err, EM_EINVAL, "convert: the %s '%s' is the input file '%s'", what,
                              out, path);
    }
    return EM_OK;
}

/* One output against the inputs: the checkpoint's shards and the files read beside them. */
static int refuse_input(const char *what, const char *out, const em_convert_opts *o,
                        const em_safetensors *st, em_err *err) {
    for (int i = 0; st && i < em_safetensors_shard_count(st); i++) {
        const char *in = em_safetensors_shard_path(st, i);
        if (same_file(out, in))
            return em_err_set(err, EM_EINVAL, "convert: the %s '%s' is the input file '%s'", what,
                              out, in);
    }
    int rc = refuse_in_dir(what, out, o->src_dir, err);
    return rc ? rc : refuse_in_dir(what, out, o->tokenizer_dir, err);
}

/* An output whose folder is missing fails now, before any work, with the writer's message. */
static int check_folder(const char *path, em_err *err) {
    char dir[4096];
    struct stat sb;
    if (stat(parent_dir(path, dir), &sb) != 0)
        return em_err_set(err, EM_EIO, "%s: cannot create: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return em_err_set(err, EM_EIO, "%s: cannot create: %s is not a folder", path, dir);
    return EM_OK;
}

int em_cv_check_outputs(const em_convert_opts *o, const em_safetensors *st, const char *const *outs,
                        int n_outs, em_err *err) {
    const char *report = o->report_path;
    int rc = report ? check_folder(report, err) : EM_OK;
    for (int i = 0; !rc && i < n_outs; i++) rc = check_folder(outs[i], err);
    if (rc) return rc;
    for (int i = 0; i < n_outs; i++) {
        if (report && same_file(outs[i], report))
            return em_err_set(err, EM_EINVAL, "convert: the output '%s' and the report '%s' are the "
                              "same file", outs[i], report);
        int rc = refuse_input("output", outs[i], o, st, err);
        if (rc) return rc;
    }
    return report ? refuse_input("report", report, o, st, err) : EM_OK;
}

int em_convert_check_paths(const em_convert_opts *o, em_err *err) {
    if (!o->src_dir || !o->out_path) return EM_OK; /* em_convert says what is missing */
    em_safetensors *st = NULL;
    /* the checkpoint's shard list (an unreadable checkpoint is em_convert's to report) */
    em_safetensors_open(&st, o->src_dir, NULL);
    int rc = em_cv_check_outputs(o, st, &o->out_path, 1, err);
    em_safetensors_close(st);
    return rc;
}

/* ---- staging and commit ------------------------------------------------------------------ */

static size_t stem_len(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".gguf") == 0 ? n - 5 : n;
}

char *em_cv_stage_path(const char *out, em_err *err) {
    size_t stem = stem_len(out), cap = strlen(out) + sizeof STAGE_TAG + 24;
    char *p = em_malloc(cap, "staging path", err);
    if (p) snprintf(p, cap, "%.*s" STAGE_TAG "%ld%s", (int)stem, out, (long)getpid(), out + stem);
    return p;
}

char *em_cv_final_path(const char *out, const char *staged, em_err *err) {
    size_t stem = stem_len(out);
    const char *rest = staged + stem + strlen(STAGE_TAG);
    while (*rest >= '0' && *rest <= '9') rest++;
    size_t cap = stem + strlen(rest) + 1;
    char *p = em_malloc(cap, "output path", err);
    if (p) snprintf(p, cap, "%.*s%s", (int)stem, out, rest);
    return p;
}

static void fsync_parent(const char *path) {
    char dir[4096];
    int fd = open(parent_dir(path, dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the renames are done */
        close(fd);
    }
}

int em_cv_commit(const em_convert_opts *o, const em_safetensors *st, const char *const *staged,
                 em_convert_report *rep, em_err *err) {
    char *report_tmp = NULL;
    const char **finals = em_calloc((size_t)rep->n_shards + 1, sizeof *finals, "outputs", err);
    if (!finals) return EM_ENOMEM;
    for (int i = 0; i < rep->n_shards; i++) finals[i] = rep->shards[i].path;
    int rc = em_cv_check_outputs(o, st, finals, rep->n_shards, err);
    if (!rc && o->report_path) rc = em_cv_report_stage(rep, o->report_path, &report_tmp, err);
    /* the report first: if it cannot go into place, no old GGUF has been replaced yet */
    if (!rc && report_tmp && rename(report_tmp, o->report_path) != 0)
        rc = em_err_set(err, EM_EIO, "%s: cannot rename %s into place: %s", o->report_path,
                        report_tmp, strerror(errno));
    bool report_placed = !rc && report_tmp;
    int renamed = 0;
    while (!rc && renamed < rep->n_shards) {
        if (rename(staged[renamed], finals[renamed]) != 0)
            rc = em_err_set(err, EM_EIO, "%s: cannot rename %s into place: %s", finals[renamed],
                            staged[renamed], strerror(errno));
        else renamed++;
    }
    if (rc) {
        /* a shard could not be renamed (the staged ones left are the caller's to remove): a
         * new set is all or nothing too, so take back what was placed */
        for (int i = 0; i < renamed; i++) unlink(finals[i]);
        if (report_placed) unlink(o->report_path);
        else if (report_tmp) unlink(report_tmp);
    } else {
        if (rep->n_shards) fsync_parent(finals[0]);
        if (o->report_path) fsync_parent(o->report_path);
    }
    free(report_tmp);
    free(finals);
    return rc;
}
