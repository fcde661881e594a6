/* Files: whole-file read-only mappings (guarded ones register with mapguard.c), pread/write
 * loops that survive EINTR and short transfers, and direct (O_DIRECT) reads with a buffered
 * fallback. Every error names the path, and for reads the byte offset. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int map_file(em_mmap *m, const char *path, bool guard, em_err *err) {
    m->data = NULL;
    m->size = 0;
    m->guard = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_err_set(err, EM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return em_err_set(err, EM_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return em_err_set(err, EM_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return em_err_set(err, EM_EIO, "%s: cannot mmap %lld bytes: %s", path,
                              (long long)st.st_size, strerror(e));
        }
        m->data = p;
        m->size = (uint64_t)st.st_size;
    }
    /* the mapping keeps the file alive; a guarded one keeps fd too, to see the file change */
    int rc = guard && m->data ? em_mmap_guard_add(m, fd, path, err) : EM_OK;
    if (rc) {
        munmap((void *)m->data, (size_t)m->size);
        m->data = NULL;
        m->size = 0;
    }
    if (rc || !m->guard) close(fd);
    return rc;
}

int em_mmap_open(em_mmap *m, const char *path, em_err *err) { return map_file(m, path, false, err); }

int em_mmap_open_guarded(em_mmap *m, const char *path, em_err *err) { return map_file(m, path, true, err); }

void em_mmap_close(em_mmap *m) {
    em_mmap_guard_remove(m); /* before munmap: the handler must not touch the range after */
    if (m->data) munmap((void *)m->data, (size_t)m->size);
    m->data = NULL;
    m->size = 0;
}

/* Reads until n bytes or end of file; returns bytes read, or -errno. */
static int64_t pread_loop(int fd, void *buf, size_t n, uint64_t offset) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

static int pread_status(int64_t got, size_t n, uint64_t offset, const char *path, em_err *err) {
    if (got < 0)
        return em_err_set(err, EM_EIO, "%s: read of %zu bytes at offset %llu failed: %s", path, n,
                          (unsigned long long)offset, strerror((int)-got));
    if ((size_t)got < n)
        return em_err_set(err, EM_EFORMAT,
                          "%s: truncated: wanted %zu bytes at offset %llu, file ends at %llu", path,
                          n, (unsigned long long)offset, (unsigned long long)(offset + (uint64_t)got));
    return EM_OK;
}

int em_pread_full(int fd, void *buf, size_t n, uint64_t offset, const char *path, em_err *err) {
    return pread_status(pread_loop(fd, buf, n, offset), n, offset, path, err);
}

int em_write_full(int fd, const void *buf, size_t n, const char *path, em_err *err) {
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            return em_err_set(err, EM_EIO, "%s: write failed: %s", path, strerror(errno));
        }
        if (w == 0) return em_err_set(err, EM_EIO, "%s: write made no progress", path);
        done += (size_t)w;
    }
    return EM_OK;
}

int em_dfile_open(em_dfile *f, const char *path, em_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = f->fd_buffered = -1;
    f->fd_buffered = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd_buffered < 0)
        return em_err_set(err, EM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(f->fd_buffered, &st) != 0) {
        int e = errno;
        em_dfile_close(f);
        return em_err_set(err, EM_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    f->size = (uint64_t)st.st_size;
    f->path = em_strdup(path, err);
    if (!f->path) {
        em_dfile_close(f);
        return EM_ENOMEM;
    }
    /* Some file systems (tmpfs, some overlays) refuse O_DIRECT: fall back to buffered. */
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    f->direct = f->fd >= 0;
    if (!f->direct) f->fd = f->fd_buffered;
    return EM_OK;
}

void em_dfile_close(em_dfile *f) {
    if (f->fd >= 0 && f->fd != f->fd_buffered) close(f->fd);
    if (f->fd_buffered >= 0) close(f->fd_buffered);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = f->fd_buffered = -1;
}

int em_dfile_read(em_dfile *f, void *buf, size_t n, uint64_t offset, em_err *err) {
    uint64_t end;
    if (em_add_overflow(offset, n, &end) || end > f->size)
        return em_err_set(err, EM_EFORMAT, "%s: read of %zu bytes at offset %llu past end (%llu)",
                          f->path, n, (unsigned long long)offset, (unsigned long long)f->size);
    bool aligned = ((uintptr_t)buf % EM_DIRECT_ALIGN) == 0 && offset % EM_DIRECT_ALIGN == 0 &&
                   n % EM_DIRECT_ALIGN == 0;
    if (f->direct && aligned) {
        int64_t got = pread_loop(f->fd, buf, n, offset);
        if (got != -EINVAL) return pread_status(got, n, offset, f->path, err);
        /* EINVAL: this file system rejects direct I/O after all; stay buffered from now on */
        close(f->fd);
        f->fd = f->fd_buffered;
        f->direct = false;
    }
    return em_pread_full(f->fd_buffered, buf, n, offset, f->path, err);
}

int em_file_read_all(const char *path, char **out, size_t *len, em_err *err) {
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_err_set(err, EM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return em_err_set(err, EM_EIO, "%s: not a readable regular file", path);
    }
    char *buf = em_malloc((size_t)st.st_size + 1, path, err);
    if (!buf) {
        close(fd);
        return EM_ENOMEM;
    }
    int rc = em_pread_full(fd, buf, (size_t)st.st_size, 0, path, err);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[st.st_size] = 0;
    *out = buf;
    *len = (size_t)st.st_size;
    return EM_OK;
}

bool em_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
