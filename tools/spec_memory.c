/* tools/spec_memory.c: the governor's memory between runs (spec_memory.h). Owns the file format
 * and its atomic replacement; what the numbers mean is decode/'s. */
#include "spec_memory.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool em_spec_memory_default(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (xdg && *xdg) n = snprintf(out, cap, "%s/ember/spec-memory", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/ember/spec-memory", home);
    return n > 0 && (size_t)n < cap;
}

/* A file's identity in the key: its full path, size and modification time. */
static int hash_file(em_sha256 *h, const char *path, em_err *err) {
    char full[PATH_MAX];
    struct stat st;
    if (!realpath(path, full) || stat(full, &st) != 0)
        return em_err_set(err, EM_EIO, "spec memory: %s: %s", path, strerror(errno));
    char line[PATH_MAX + 64];
    const int n = snprintf(line, sizeof line, "%s|%lld|%lld.%09ld|", full, (long long)st.st_size,
                           (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    em_sha256_update(h, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
    return EM_OK;
}

int em_spec_memory_key(const em_model_flags *f, char key[65], em_err *err) {
    em_sha256 *h;
    int rc = em_sha256_create(&h, err);
    if (rc) return rc;
    rc = hash_file(h, f->model, err);
    if (!rc && f->draft) rc = hash_file(h, f->draft, err);
    if (!rc) {
        char setup[512];
        const int n = snprintf(setup, sizeof setup, "device %d:%d|draft %s|threads %d|width %d|moe %s %llu %d|feat %s",
                               f->device, f->cuda_index, f->draft_device ? f->draft_device : "cpu", f->n_threads,
                               f->verify_width, f->moe_storage ? f->moe_storage : "auto",
                               (unsigned long long)f->expert_cache, f->expert_no_prefetch,
                               f->feature_dtype ? f->feature_dtype : "f32");
        em_sha256_update(h, setup, (size_t)(n < (int)sizeof setup ? n : (int)sizeof setup - 1));
        uint8_t d[32];
        em_sha256_final(h, d);
        em_sha256_hex(d, key);
    }
    em_sha256_free(h);
    return rc;
}

/* Line [p, end): "<64 hex> <known> <numbers>" into its parts; false when it is not one. */
static bool parse_line(const char *p, const char *end, char key[65], unsigned *known,
                       double v[EM_DECODE_LEARNT_VALUES]) {
    char buf[2048];
    const size_t n = (size_t)(end - p);
    if (n >= sizeof buf) return false;
    memcpy(buf, p, n);
    buf[n] = 0;
    char *s = buf, *e;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    if (s[64] != ' ') return false;
    memcpy(key, s, 64);
    key[64] = 0;
    s += 65;
    errno = 0;
    const unsigned long k = strtoul(s, &e, 10);
    if (e == s || errno || k > 3) return false;
    *known = (unsigned)k;
    s = e;
    for (int i = 0; i < EM_DECODE_LEARNT_VALUES; i++) {
        errno = 0;
        v[i] = strtod(s, &e);
        if (e == s || errno || !isfinite(v[i])) return false;
        s = e;
    }
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    return *s == 0;
}

/* One well-formed line of a file: where it is, and its parts. */
typedef struct sm_entry {
    const char *at;
    size_t len;
    char key[65];
    unsigned known;
    double v[EM_DECODE_LEARNT_VALUES];
} sm_entry;

/* The next well-formed line from *p (before end) into e, *p past it; false at the end. Lines
 * that do not parse are skipped. */
static bool next_entry(const char **p, const char *end, sm_entry *e) {
    while (*p && *p < end) {
        const char *nl = memchr(*p, '\n', (size_t)(end - *p)), *le = nl ? nl : end;
        e->at = *p, e->len = (size_t)(le - *p);
        *p = nl ? nl + 1 : end;
        if (parse_line(e->at, le, e->key, &e->known, e->v)) return true;
    }
    return false;
}

bool em_spec_memory_find(const char *text, size_t len, const char *key, unsigned *known,
                         double v[EM_DECODE_LEARNT_VALUES]) {
    bool found = false;
    sm_entry e;
    for (const char *p = text; next_entry(&p, text + len, &e);)
        if (!strcmp(e.key, key)) { /* the last line of a key counts */
            *known = e.known;
            memcpy(v, e.v, sizeof e.v);
            found = true;
        }
    return found;
}

void em_spec_memory_load(const char *path, const char *key, em_decode *s) {
    char *text = NULL;
    size_t len = 0;
    em_err err = { 0 };
    if (!em_file_exists(path)) return; /* nothing learnt yet */
    if (em_file_read_all(path, &text, &len, &err)) {
        em_log(EM_LOG_WARN, "spec memory %s not read (%s): speculation is probed afresh", path, err.msg);
        return;
    }
    unsigned known = 0;
    double v[EM_DECODE_LEARNT_VALUES];
    if (em_spec_memory_find(text, len, key, &known, v) && em_decode_learnt_set(s, known, v, &err))
        em_log(EM_LOG_WARN, "spec memory %s: %s; ignored", path, err.msg);
    free(text);
}

/* mkdir -p of path's folder. */
static int make_folder(const char *path) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return -1;
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(dir, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* The file's other keys' well-formed lines (the last SPEC_MEMORY_LINES - 1), then key's. */
static char *new_text(const char *old, size_t len, const char *key, unsigned known,
                      const double v[EM_DECODE_LEARNT_VALUES], size_t *out_len) {
    const char *lines[SPEC_MEMORY_LINES];
    size_t lens[SPEC_MEMORY_LINES];
    int n = 0;
    sm_entry e;
    for (const char *p = old; old && next_entry(&p, old + len, &e);) {
        if (!strcmp(e.key, key)) continue;
        if (n == SPEC_MEMORY_LINES - 1) { /* drop the oldest */
            memmove(lines, lines + 1, (size_t)(n - 1) * sizeof lines[0]);
            memmove(lens, lens + 1, (size_t)(n - 1) * sizeof lens[0]);
            n--;
        }
        lines[n] = e.at, lens[n] = e.len, n++;
    }
    size_t cap = 64 + 16 + 32 * EM_DECODE_LEARNT_VALUES + 2; /* key, known, " %.17g" (at most 25) each, "\n" */
    for (int i = 0; i < n; i++) cap += lens[i] + 1;
    char *t = malloc(cap), *w = t;
    if (!t) return NULL;
    for (int i = 0; i < n; i++) memcpy(w, lines[i], lens[i]), w += lens[i], *w++ = '\n';
    w += snprintf(w, cap - (size_t)(w - t), "%s %u", key, known);
    for (int i = 0; i < EM_DECODE_LEARNT_VALUES; i++) w += snprintf(w, cap - (size_t)(w - t), " %.17g", v[i]);
    *w++ = '\n';
    *out_len = (size_t)(w - t);
    return t;
}

void em_spec_memory_save(const char *path, const char *key, const em_decode *s) {
    double v[EM_DECODE_LEARNT_VALUES];
    const unsigned known = em_decode_learnt_get(s, v);
    if (!known) return;
    char *old = NULL, tmp[PATH_MAX];
    size_t len = 0, n = 0;
    em_err err = { 0 };
    if (em_file_exists(path) && em_file_read_all(path, &old, &len, &err)) old = NULL, len = 0;
    char *text = new_text(old, len, key, known, v, &n);
    free(old);
    int rc = text && snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) < (int)sizeof tmp ? 0 : -1;
    FILE *f = NULL;
    if (!rc) rc = make_folder(path);
    if (!rc) rc = (f = fopen(tmp, "w")) ? 0 : -1;
    if (!rc) rc = fwrite(text, 1, n, f) == n ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    if (!rc) rc = rename(tmp, path);
    if (rc) {
        em_log(EM_LOG_WARN, "spec memory %s not written (%s)", path, strerror(errno));
        if (f) unlink(tmp);
    }
    free(text);
}
