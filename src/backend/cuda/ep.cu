/* backend/cuda/ep.cu: the exchanges of expert parallelism between the devices of one host
 * (docs/cuda.md "Several GPUs"): device 0 broadcasts a MoE layer's input rows and routes to
 * the others, and gathers the down outputs of the experts each holds (em_gpu_moe_share) back.
 *
 * Invariants:
 * - NCCL (libnccl.so.2, loaded when a communicator of two or more devices is opened, so that
 *   a one-device run and a build machine without NCCL need none of it) moves the bytes, on
 *   each device's current stream (em_gpu_branch), in one NCCL group per exchange: one host
 *   thread drives every device, and nothing waits on the host.
 * - Bytes are copied as they are: an exchange changes no value, so the combined result is the
 *   one-device result bit for bit.
 * - NVLink multicast stays off: NCCL_NVLS_ENABLE=0 is set before the first communicator unless
 *   the environment sets it (on these machines multicast can take the GPUs out of service). */
#include "backend/cuda/cuda_impl.cuh"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#if EM_HAVE_NCCL
#include <nccl.h>

/* The NCCL entry points this file calls, from libnccl.so.2. */
typedef struct nccl_api {
    ncclResult_t (*init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*destroy)(ncclComm_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    const char *(*error_string)(ncclResult_t);
} nccl_api;

static int nccl_load(nccl_api *a, em_err *err) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* before NCCL reads its environment; a user's value stays */
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return em_err_set(err, EM_EUNSUPPORTED, "several GPUs need NCCL, and libnccl.so.2 could not be loaded (%s)",
                          dlerror());
    struct {
        void **fn;
        const char *name;
    } syms[] = { { (void **)&a->init_all, "ncclCommInitAll" },   { (void **)&a->destroy, "ncclCommDestroy" },
                 { (void **)&a->group_start, "ncclGroupStart" }, { (void **)&a->group_end, "ncclGroupEnd" },
                 { (void **)&a->broadcast, "ncclBroadcast" },    { (void **)&a->send, "ncclSend" },
                 { (void **)&a->recv, "ncclRecv" },              { (void **)&a->error_string, "ncclGetErrorString" } };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!(*syms[i].fn = dlsym(h, syms[i].name)))
            return em_err_set(err, EM_EUNSUPPORTED, "libnccl.so.2 has no %s (NCCL 2.7 or later is needed)", syms[i].name);
    return EM_OK; /* the library stays loaded for the process */
}
#endif

struct em_gpu_ep {
    int n;
    em_gpu *gpu[EM_GPU_MAX_SHARES];
#if EM_HAVE_NCCL
    nccl_api api;
    ncclComm_t comm[EM_GPU_MAX_SHARES];
#endif
};

#if EM_HAVE_NCCL
static int nccl_fail(const em_gpu_ep *ep, em_err *err, ncclResult_t r, const char *what) {
    return em_err_set(err, EM_EIO, "NCCL %s: %s", what, ep->api.error_string(r));
}
#define EP_TRY(call, what)                                         \
    do {                                                           \
        ncclResult_t r_ = (call);                                  \
        if (r_ != ncclSuccess) return nccl_fail(ep, err, r_, what); \
    } while (0)
#endif

extern "C" int em_gpu_ep_open(em_gpu *const *gpus, int n, em_gpu_ep **out, em_err *err) {
    *out = NULL;
    EMC_CHECK(gpus && n >= 1 && n <= EM_GPU_MAX_SHARES, "several GPUs: %d devices (1..%d)", n, EM_GPU_MAX_SHARES);
    int dev[EM_GPU_MAX_SHARES];
    for (int r = 0; r < n; r++) {
        EMC_CHECK(gpus[r], "several GPUs: device %d is not open", r);
        dev[r] = gpus[r]->index;
        for (int q = 0; q < r; q++)
            EMC_CHECK(dev[q] != dev[r], "several GPUs: cuda:%d is listed twice (each device takes one share)", dev[r]);
    }
    em_gpu_ep *ep = (em_gpu_ep *)calloc(1, sizeof *ep);
    if (!ep) return em_err_set(err, EM_ENOMEM, "several GPUs: out of memory");
    ep->n = n;
    memcpy(ep->gpu, gpus, (size_t)n * sizeof *gpus);
    if (n > 1) {
#if EM_HAVE_NCCL
        int rc = nccl_load(&ep->api, err);
        if (!rc) {
            ncclResult_t r = ep->api.init_all(ep->comm, n, dev);
            if (r != ncclSuccess) rc = nccl_fail(ep, err, r, "ncclCommInitAll");
        }
        if (rc) {
            memset(ep->comm, 0, sizeof ep->comm);
            em_gpu_ep_close(ep);
            return rc;
        }
#else
        free(ep);
        return em_err_set(err, EM_EUNSUPPORTED, "several GPUs need NCCL, and this ember was built without it (nccl.h)");
#endif
    }
    *out = ep;
    return EM_OK;
}

extern "C" void em_gpu_ep_close(em_gpu_ep *ep) {
    if (!ep) return;
#if EM_HAVE_NCCL
    for (int r = 0; r < ep->n; r++)
        if (ep->comm[r]) ep->api.destroy(ep->comm[r]);
#endif
    free(ep);
}

extern "C" int em_gpu_ep_devices(const em_gpu_ep *ep) { return ep ? ep->n : 0; }

extern "C" int em_gpu_ep_broadcast(em_gpu_ep *ep, void *const *bufs, uint64_t bytes, em_err *err) {
    EMC_CHECK(ep && bufs, "several GPUs: broadcast without a communicator or buffers");
    for (int r = 0; r < ep->n; r++) EMC_CHECK(bufs[r], "several GPUs: broadcast: no buffer on device %d", r);
    if (ep->n == 1 || bytes == 0) return EM_OK;
#if EM_HAVE_NCCL
    EP_TRY(ep->api.group_start(), "group start (broadcast)");
    for (int r = 0; r < ep->n; r++) {
        const ncclResult_t res = ep->api.broadcast(bufs[0], bufs[r], (size_t)bytes, ncclUint8, 0, ep->comm[r],
                                                   ep->gpu[r]->stream);
        if (res != ncclSuccess) {
            ep->api.group_end();
            return nccl_fail(ep, err, res, "broadcast");
        }
    }
    EP_TRY(ep->api.group_end(), "group end (broadcast)");
    return EM_OK;
#else
    return em_err_set(err, EM_EUNSUPPORTED, "several GPUs: built without NCCL");
#endif
}

extern "C" int em_gpu_ep_gather(em_gpu_ep *ep, const void *const *src, void *const *dst, uint64_t bytes, em_err *err) {
    EMC_CHECK(ep && src && dst, "several GPUs: gather without a communicator or buffers");
    for (int r = 1; r < ep->n; r++) EMC_CHECK(src[r] && dst[r], "several GPUs: gather: no buffer for device %d", r);
    if (ep->n == 1 || bytes == 0) return EM_OK;
#if EM_HAVE_NCCL
    EP_TRY(ep->api.group_start(), "group start (gather)");
    ncclResult_t res = ncclSuccess;
    for (int r = 1; r < ep->n && res == ncclSuccess; r++) {
        res = ep->api.send(src[r], (size_t)bytes, ncclUint8, 0, ep->comm[r], ep->gpu[r]->stream);
        if (res == ncclSuccess) res = ep->api.recv(dst[r], (size_t)bytes, ncclUint8, r, ep->comm[0], ep->gpu[0]->stream);
    }
    const ncclResult_t end = ep->api.group_end();
    if (res != ncclSuccess) return nccl_fail(ep, err, res, "send/recv (gather)");
    if (end != ncclSuccess) return nccl_fail(ep, err, end, "group end (gather)");
    return EM_OK;
#else
    return em_err_set(err, EM_EUNSUPPORTED, "several GPUs: built without NCCL");
#endif
}
