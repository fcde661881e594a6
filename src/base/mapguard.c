/* Guarded mappings: read-only file mappings whose file may change under them (a model file
 * truncated or rewritten while it is served) without killing the process. A read of a mapped
 * page past the file's new end raises SIGBUS; the handler here finds the mapping the address
 * belongs to, replaces its pages from the faulting one to the end of the mapping with
 * anonymous zero pages (so the read, and the computation around it, finishes on zeros) and
 * marks the mapping damaged. Callers learn of it through em_mmap_check, which also compares
 * each file's size and modification time with those at mapping time (a change between two
 * computations is caught without any fault). Damage is permanent: the data is no longer the
 * file's, whatever the file does next.
 *
 * Invariants: the registry is a fixed array; a slot is published by storing its end, then its
 * start (release), and retired by clearing start first. The signal handler only reads start,
 * end and sets the damaged flag (lock-free atomics), and calls only mmap and sigaction; all
 * other fields are touched under reg_mu only. The handler is installed with the first guarded
 * mapping (and again by a later one if someone replaced it), and a fault outside every guarded
 * mapping goes to the handler that was there before (or the default action, which ends the
 * process as it would have). */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_GUARDED 256

typedef struct guard_slot {
    _Atomic uintptr_t start; /* 0: the slot is free */
    _Atomic uintptr_t end;   /* start + size rounded up to whole pages */
    atomic_int damaged;      /* pages were lost (handler) or the file changed (check) */
    /* under reg_mu */
    bool used;
    int fd;                  /* kept open for fstat: the mapped inode, not whatever has the name now */
    uint64_t size;
    struct timespec mtime;
    char *path;
} guard_slot;

static guard_slot slots[MAX_GUARDED];
static atomic_int n_damaged;  /* fast path of em_mmap_check */
static atomic_int n_slots;    /* slots in use at some time: the handler scans [0, n_slots) */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction prev_action;
static uintptr_t page_size;

/* ---- the SIGBUS handler (async-signal-safe code only) ------------------------------------ */

/* A fault we do not own: what would have happened without us. */
static void chain(int sig, siginfo_t *si, void *uc) {
    void (*h)(int) = prev_action.sa_handler;
    if (h == SIG_IGN) return;
    if (h == SIG_DFL) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        /* a real fault repeats when we return and now ends the process; a sent signal does not */
        if (si->si_code <= 0) raise(sig);
        return;
    }
    if (prev_action.sa_flags & SA_SIGINFO) prev_action.sa_sigaction(sig, si, uc);
    else h(sig);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    int n = atomic_load(&n_slots);
    for (int i = 0; si->si_code > 0 && i < n; i++) {
        uintptr_t s = atomic_load(&slots[i].start), e = atomic_load(&slots[i].end);
        if (!s || a < s || a >= e) continue;
        uintptr_t p = a & ~(page_size - 1);
        if (mmap((void *)p, e - p, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) break;
        if (atomic_exchange(&slots[i].damaged, 1) == 0) atomic_fetch_add(&n_damaged, 1);
        return; /* the read repeats, on zeros */
    }
    chain(sig, si, uc);
}

/* Installs the handler unless it is in place. Checked at every registration, not once: a
 * program (or a test harness) that set its own SIGBUS handler since replaced ours, and ours
 * then chains to that one. */
static int install_locked(em_err *err) {
    struct sigaction cur, sa;
    if (sigaction(SIGBUS, NULL, &cur))
        return em_err_set(err, EM_EIO, "cannot read the SIGBUS disposition: %s", strerror(errno));
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus) return EM_OK;
    if (!page_size) {
        long ps = sysconf(_SC_PAGESIZE);
        page_size = ps > 0 ? (uintptr_t)ps : 4096;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    prev_action = cur; /* before ours is in place: the handler may run at once */
    if (sigaction(SIGBUS, &sa, NULL))
        return em_err_set(err, EM_EIO, "cannot install the SIGBUS handler for mapped files: %s", strerror(errno));
    return EM_OK;
}

/* ---- the registry ------------------------------------------------------------------------ */

int em_mmap_guard_add(em_mmap *m, int fd, const char *path, em_err *err) {
    m->guard = 0;
    if (!m->data) return EM_OK; /* an empty file has nothing to lose */
    struct stat st;
    if (fstat(fd, &st)) return em_err_set(err, EM_EIO, "%s: cannot stat: %s", path, strerror(errno));
    char *copy = em_strdup(path, err);
    if (!copy) return EM_ENOMEM;
    pthread_mutex_lock(&reg_mu);
    int rc = install_locked(err), i = 0;
    while (!rc && i < MAX_GUARDED && slots[i].used) i++;
    if (!rc && i == MAX_GUARDED)
        rc = em_err_set(err, EM_EOVERFLOW, "%s: more than %d files are mapped at once", path, MAX_GUARDED);
    if (rc) {
        pthread_mutex_unlock(&reg_mu);
        free(copy);
        return rc;
    }
    guard_slot *g = &slots[i];
    g->used = true;
    g->fd = fd;
    g->size = m->size;
    g->mtime = st.st_mtim;
    g->path = copy;
    atomic_store(&g->damaged, 0);
    uintptr_t s = (uintptr_t)m->data;
    atomic_store(&g->end, s + (uintptr_t)em_align_up(m->size, page_size));
    atomic_store(&g->start, s);
    if (i + 1 > atomic_load(&n_slots)) atomic_store(&n_slots, i + 1);
    m->guard = i + 1;
    pthread_mutex_unlock(&reg_mu);
    return EM_OK;
}

void em_mmap_guard_remove(em_mmap *m) {
    if (!m->guard) return;
    pthread_mutex_lock(&reg_mu);
    guard_slot *g = &slots[m->guard - 1];
    atomic_store(&g->start, 0);
    atomic_store(&g->end, 0);
    if (atomic_exchange(&g->damaged, 0)) atomic_fetch_sub(&n_damaged, 1);
    close(g->fd);
    free(g->path);
    g->path = NULL;
    g->used = false;
    pthread_mutex_unlock(&reg_mu);
    m->guard = 0;
}

bool em_mmap_damaged(const em_mmap *m) { return m->guard && atomic_load(&slots[m->guard - 1].damaged); }

/* Whether g's file still has the size and modification time it had when mapped; now: its size. */
static bool file_unchanged(const guard_slot *g, uint64_t *now) {
    struct stat st;
    if (fstat(g->fd, &st)) return true; /* cannot tell: a fault would still be caught */
    *now = (uint64_t)st.st_size;
    return *now == g->size && st.st_mtim.tv_sec == g->mtime.tv_sec && st.st_mtim.tv_nsec == g->mtime.tv_nsec;
}

int em_mmap_check(bool check_files, em_err *err) {
    if (!check_files && atomic_load(&n_damaged) == 0) return EM_OK;
    int rc = EM_OK;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < atomic_load(&n_slots) && !rc; i++) {
        guard_slot *g = &slots[i];
        if (!g->used) continue;
        uint64_t now = g->size;
        bool same = file_unchanged(g, &now);
        if (!atomic_load(&g->damaged) && (!check_files || same)) continue;
        if (atomic_exchange(&g->damaged, 1) == 0) atomic_fetch_add(&n_damaged, 1);
        rc = em_err_set(err, EM_EIO, "%s changed on disk while mapped (%llu bytes now, %llu mapped)", g->path,
                        (unsigned long long)now, (unsigned long long)g->size);
    }
    pthread_mutex_unlock(&reg_mu);
    return rc;
}
