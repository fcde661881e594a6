/* experts/ internals shared by cache.c and io.c (not part of the layer's interface). */
#ifndef EM_EXPERTS_IMPL_H
#define EM_EXPERTS_IMPL_H

#include "experts/experts.h"

/* One read: bytes at offset of file into dst (EM_DIRECT_ALIGN-aligned offset, length and
 * buffer); the first `need` bytes must arrive (the rest may lie past the end of the file). */
typedef struct em_xio_req {
    int file;
    uint64_t offset, bytes, need;
    void *dst;
    uint64_t got; /* out */
    bool done;    /* out, read-ahead: settled (status says how) */
    int status;   /* out, read-ahead */
} em_xio_req;

typedef struct em_xio em_xio;

int em_xio_open(em_xio **out, const em_expert_store *s, int mode, bool buffered, em_err *err);
void em_xio_close(em_xio *io);
bool em_xio_uring(const em_xio *io);
bool em_xio_direct(const em_xio *io);
void em_xio_fault_arm(em_xio *io, int kind, uint64_t after_n_reads);

/* Work to do while the reads are in flight; its status is returned if the reads succeed. */
typedef int (*em_xio_overlap_fn)(void *ctx, em_err *err);

/* Reads all n requests (reordered by file and offset), calling overlap (may be NULL) once
 * after they are issued. Always waits for every issued read before returning, even when
 * overlap or a read fails, so the caller may free the buffers. The first failure wins. */
int em_xio_read(em_xio *io, em_xio_req *reqs, int n, em_xio_overlap_fn overlap, void *ctx,
                em_err *err);

/* Read-ahead: em_xio_submit issues n requests (at most em_xio_ahead_room; 0 without io_uring)
 * and returns at once; the requests and their buffers must stay valid until each is done.
 * Consecutive groups of `group` requests are dealt round-robin to `chains` chains, each run
 * in order by the kernel (linked): at most `chains` reads of the batch are in flight at once,
 * so the earliest requests complete first (a failure or short read cancels the rest of its
 * chain: they settle as failed).
 * em_xio_reap settles the completed ones (done, status, got; a failure is only a status: the
 * reader falls back to em_xio_read, which reports it), waiting for one first when wait is
 * set and any is in flight; it returns how many it settled. */
int em_xio_ahead_room(const em_xio *io);
int em_xio_submit(em_xio *io, em_xio_req *const *reqs, int n, int group, int chains, em_err *err);
int em_xio_reap(em_xio *io, bool wait);

#endif
