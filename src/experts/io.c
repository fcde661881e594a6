/* experts/io: batched expert reads. Owns the shard files (em_dfile: O_DIRECT where the file
 * system accepts it, buffered otherwise) and one io_uring (liburing) when the kernel lets us
 * create it; otherwise plain pread. Requests are sorted by (file, offset) and issued together;
 * every read is checked: an I/O error, a short read, or a file that shrank since open fail
 * with the file and offset named. Invariant: em_xio_read never returns while a read it issued
 * is still in flight, so the caller may free or reuse the buffers at once. Read-ahead
 * (em_xio_submit / em_xio_reap) goes through a second ring of its own, so that its
 * completions never mix with em_xio_read's; its requests stay in flight across calls until
 * reaped, and em_xio_close waits for them. The fault shim (tests) rewrites the result of one
 * chosen completed read of em_xio_read (never of a read-ahead, which may fail unseen). */
#include "experts/experts_impl.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XIO_DEPTH 64
#define XIO_MAX_RING_READ (1ull << 30) /* larger requests go through pread */

struct em_xio {
    int n_files;
    em_dfile *files;
    bool uring;
    struct io_uring ring;
    bool ahead;                /* the read-ahead ring exists */
    struct io_uring ahead_ring;
    int ahead_inflight;
    int fault_kind;
    uint64_t fault_countdown;
};

int em_xio_open(em_xio **out, const em_expert_store *s, int mode, bool buffered, em_err *err) {
    *out = NULL;
    em_xio *io = em_calloc(1, sizeof *io, "expert io", err);
    if (!io) return EM_ENOMEM;
    io->n_files = em_expert_store_n_shards(s);
    io->files = em_calloc((size_t)(io->n_files ? io->n_files : 1), sizeof *io->files, "expert files", err);
    int rc = io->files ? EM_OK : EM_ENOMEM;
    for (int i = 0; i < io->n_files; i++) io->files[i].fd = io->files[i].fd_buffered = -1;
    for (int i = 0; !rc && i < io->n_files; i++) {
        rc = em_dfile_open(&io->files[i], em_expert_store_shard_path(s, i), err);
        if (!rc && buffered && io->files[i].direct) { /* keep only the buffered descriptor */
            close(io->files[i].fd);
            io->files[i].fd = io->files[i].fd_buffered;
            io->files[i].direct = false;
        }
    }
    if (!rc && mode != EM_EXPERT_IO_PREAD) {
        int r = io_uring_queue_init(XIO_DEPTH, &io->ring, 0);
        io->uring = r == 0;
        io->ahead = io->uring && io_uring_queue_init(XIO_DEPTH, &io->ahead_ring, 0) == 0;
        if (r < 0 && mode == EM_EXPERT_IO_URING)
            rc = em_err_set(err, EM_EUNSUPPORTED, "io_uring unavailable: %s", strerror(-r));
        else if (r < 0)
            em_log(EM_LOG_INFO, "experts: io_uring unavailable (%s), using pread", strerror(-r));
    }
    if (rc) {
        em_xio_close(io);
        return rc;
    }
    *out = io;
    return EM_OK;
}

void em_xio_close(em_xio *io) {
    if (!io) return;
    while (io->ahead_inflight > 0) em_xio_reap(io, true);
    if (io->ahead) io_uring_queue_exit(&io->ahead_ring);
    if (io->uring) io_uring_queue_exit(&io->ring);
    for (int i = 0; io->files && i < io->n_files; i++)
        if (io->files[i].fd_buffered >= 0) em_dfile_close(&io->files[i]);
    free(io->files);
    free(io);
}

bool em_xio_uring(const em_xio *io) { return io->uring; }

bool em_xio_direct(const em_xio *io) {
    for (int i = 0; i < io->n_files; i++)
        if (!io->files[i].direct) return false;
    return io->n_files > 0;
}

void em_xio_fault_arm(em_xio *io, int kind, uint64_t after_n_reads) {
    io->fault_kind = kind;
    io->fault_countdown = after_n_reads;
}

/* Reads until n bytes or end of file; bytes read, or -errno. */
static int64_t pread_some(int fd, void *buf, uint64_t n, uint64_t offset) {
    uint8_t *p = buf;
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, (size_t)(n - done), (off_t)(offset + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        if (r == 0) break;
        done += (uint64_t)r;
    }
    return (int64_t)done;
}

/* A file system that refused an O_DIRECT read: read it buffered from now on. */
static void drop_direct(em_dfile *f) {
    if (!f->direct) return;
    close(f->fd);
    f->fd = f->fd_buffered;
    f->direct = false;
}

/* Settles one request given the first attempt's result (bytes or -errno): retries refused
 * direct reads buffered, completes partial reads, applies the fault shim, then checks. */
static int settle(em_xio *io, em_xio_req *r, int64_t res, bool shim, em_err *err) {
    em_dfile *f = &io->files[r->file];
    if (res == -EINVAL) {
        drop_direct(f);
        res = pread_some(f->fd_buffered, r->dst, r->bytes, r->offset);
    }
    if (res >= 0 && (uint64_t)res < r->need) {
        int64_t more = pread_some(f->fd_buffered, (uint8_t *)r->dst + res, r->bytes - (uint64_t)res,
                                  r->offset + (uint64_t)res);
        res = more < 0 ? more : res + more;
    }
    if (shim && io->fault_kind != EM_EXPERT_FAULT_NONE && io->fault_countdown-- == 0) {
        res = io->fault_kind == EM_EXPERT_FAULT_EIO ? -EIO : (int64_t)(r->need / 2);
        io->fault_kind = EM_EXPERT_FAULT_NONE;
    }
    r->got = res > 0 ? (uint64_t)res : 0;
    if (res < 0)
        return em_err_set(err, EM_EIO, "%s: read of %llu bytes at offset %llu failed: %s", f->path,
                          (unsigned long long)r->bytes, (unsigned long long)r->offset,
                          strerror((int)-res));
    if ((uint64_t)res >= r->need) return EM_OK;
    struct stat st;
    if (fstat(f->fd_buffered, &st) == 0 && (uint64_t)st.st_size < f->size)
        return em_err_set(err, EM_EIO,
                          "%s: file shrank after load (%llu -> %llu bytes): read at offset %llu "
                          "got %llu of %llu bytes", f->path, (unsigned long long)f->size,
                          (unsigned long long)st.st_size, (unsigned long long)r->offset,
                          (unsigned long long)res, (unsigned long long)r->need);
    return em_err_set(err, EM_EIO, "%s: short read at offset %llu: got %llu of %llu bytes", f->path,
                      (unsigned long long)r->offset, (unsigned long long)res,
                      (unsigned long long)r->need);
}

static int by_file_offset(const void *a, const void *b) {
    const em_xio_req *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Keeps the first failure's status and message (each attempt reports into tmp). */
static void keep(int *first, int rc, const em_err *tmp, em_err *err) {
    if (rc && !*first) {
        *first = rc;
        if (err) *err = *tmp;
    }
}

static int read_pread(em_xio *io, em_xio_req *reqs, int n, em_xio_overlap_fn overlap, void *ctx,
                      em_err *err) {
    int first = overlap ? overlap(ctx, err) : EM_OK;
    for (int i = 0; i < n && !first; i++) {
        em_xio_req *r = &reqs[i];
        first = settle(io, r, pread_some(io->files[r->file].fd, r->dst, r->bytes, r->offset), true, err);
    }
    return first;
}

static int read_uring(em_xio *io, em_xio_req *reqs, int n, em_xio_overlap_fn overlap, void *ctx,
                      em_err *err) {
    int first = EM_OK, next = 0, inflight = 0, unsubmitted = 0;
    bool overlapped = false;
    em_err tmp;
    while ((!unsubmitted && next < n) || inflight > 0) {
        int queued = 0;
        struct io_uring_sqe *sqe;
        while (!first && !unsubmitted && next < n && inflight + queued < XIO_DEPTH) {
            em_xio_req *r = &reqs[next];
            if (r->bytes > XIO_MAX_RING_READ) { /* too long for one ring read */
                int rc = settle(io, r, pread_some(io->files[r->file].fd, r->dst, r->bytes, r->offset),
                                true, &tmp);
                keep(&first, rc, &tmp, err);
                next++;
                continue;
            }
            if (!(sqe = io_uring_get_sqe(&io->ring))) break;
            io_uring_prep_read(sqe, io->files[r->file].fd, r->dst, (unsigned)r->bytes, r->offset);
            io_uring_sqe_set_data(sqe, r);
            queued++;
            next++;
        }
        while (queued > 0) {
            int s = io_uring_submit(&io->ring);
            if (s == -EINTR || s == -EAGAIN || s == -EBUSY) continue;
            if (s < 0) { /* the ring refuses work: drain it, then go on with pread */
                em_log(EM_LOG_WARN, "experts: io_uring_submit: %s; using pread", strerror(-s));
                unsubmitted = queued;
                break;
            }
            inflight += s;
            queued -= s;
        }
        if (!overlapped) {
            overlapped = true;
            if (overlap) keep(&first, overlap(ctx, &tmp), &tmp, err);
        }
        if (inflight == 0) {
            if (first) break;
            continue;
        }
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&io->ring, &cqe);
        if (w == -EINTR || w == -EAGAIN) continue;
        if (w < 0) { /* only a corrupted ring gets here; reads into the caller's buffers may
                      * still be in flight, so returning would be unsafe */
            em_log(EM_LOG_ERROR, "experts: io_uring_wait_cqe: %s", strerror(-w));
            abort();
        }
        em_xio_req *r = io_uring_cqe_get_data(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        inflight--;
        keep(&first, settle(io, r, res, true, &tmp), &tmp, err);
    }
    if (unsubmitted) { /* nothing is in flight now; the never-submitted entries die with it */
        io_uring_queue_exit(&io->ring);
        io->uring = false;
        if (!first)
            first = read_pread(io, reqs + (next - unsubmitted), n - (next - unsubmitted), NULL, NULL,
                               err);
    }
    return first;
}

int em_xio_read(em_xio *io, em_xio_req *reqs, int n, em_xio_overlap_fn overlap, void *ctx,
                em_err *err) {
    qsort(reqs, (size_t)n, sizeof *reqs, by_file_offset);
    return io->uring ? read_uring(io, reqs, n, overlap, ctx, err)
                     : read_pread(io, reqs, n, overlap, ctx, err);
}

/* ---- read-ahead --------------------------------------------------------------------------- */

int em_xio_ahead_room(const em_xio *io) {
    return io->ahead ? XIO_DEPTH - io->ahead_inflight : 0;
}

int em_xio_submit(em_xio *io, em_xio_req *const *reqs, int n, int group, int chains, em_err *err) {
    if (group < 1 || chains < 1)
        return em_err_set(err, EM_EINVAL, "experts: read-ahead in groups of %d over %d chains", group, chains);
    if (n > em_xio_ahead_room(io))
        return em_err_set(err, EM_EINVAL, "experts: %d read-ahead requests, room for %d", n,
                          em_xio_ahead_room(io));
    for (int i = 0; i < n; i++) {
        if (reqs[i]->bytes > XIO_MAX_RING_READ)
            return em_err_set(err, EM_EINVAL, "experts: a read-ahead of %llu bytes is too long",
                              (unsigned long long)reqs[i]->bytes);
        reqs[i]->done = false;
        reqs[i]->status = EM_OK;
    }
    /* groups dealt round-robin to the chains; a chain's entries lie back to back in the ring,
     * each linked to the next, so the kernel runs them one after another */
    const int n_groups = (n + group - 1) / group;
    for (int ch = 0; ch < chains; ch++)
        for (int gi = ch; gi < n_groups; gi += chains)
            for (int i = gi * group; i < n && i < (gi + 1) * group; i++) {
                struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ahead_ring); /* room checked above */
                em_xio_req *r = reqs[i];
                io_uring_prep_read(sqe, io->files[r->file].fd, r->dst, (unsigned)r->bytes, r->offset);
                io_uring_sqe_set_data(sqe, r);
                const bool group_end = i + 1 == n || i + 1 == (gi + 1) * group;
                const bool last = group_end && gi + chains >= n_groups;
                if (!last) sqe->flags |= IOSQE_IO_LINK;
            }
    int left = n;
    while (left > 0) {
        int s = io_uring_submit(&io->ahead_ring);
        if (s == -EINTR || s == -EAGAIN || s == -EBUSY) continue;
        if (s < 0) { /* cannot happen with a healthy ring; the entries would be left queued */
            em_log(EM_LOG_ERROR, "experts: read-ahead io_uring_submit: %s", strerror(-s));
            abort();
        }
        io->ahead_inflight += s;
        left -= s;
    }
    return EM_OK;
}

int em_xio_reap(em_xio *io, bool wait) {
    int reaped = 0;
    while (io->ahead_inflight > 0) {
        struct io_uring_cqe *cqe;
        int w = wait && reaped == 0 ? io_uring_wait_cqe(&io->ahead_ring, &cqe)
                                    : io_uring_peek_cqe(&io->ahead_ring, &cqe);
        if (w == -EINTR) continue;
        if (w == -EAGAIN) break; /* nothing completed yet */
        if (w < 0) { /* a corrupted ring; reads may still land in the caller's buffers */
            em_log(EM_LOG_ERROR, "experts: read-ahead io_uring_wait_cqe: %s", strerror(-w));
            abort();
        }
        em_xio_req *r = io_uring_cqe_get_data(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&io->ahead_ring, cqe);
        io->ahead_inflight--;
        em_err tmp;
        r->status = settle(io, r, res, false, &tmp);
        r->done = true;
        reaped++;
    }
    return reaped;
}
