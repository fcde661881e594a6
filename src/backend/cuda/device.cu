/* backend/cuda/device.cu: devices, contexts, memory, graphs and timing marks of the CUDA
 * backend. A context owns one device's main stream, four side streams for concurrent branches
 * (fork / branch / join), and events; it holds no other state, so everything a pass needs
 * lives in buffers its owner allocated. Host waits (downloads, syncs, uploads) and graph
 * launches go through the main stream. Errors name the CUDA call and
 * CUDA's own message; an allocation that does not fit says how many bytes were asked for and
 * how many are free. */
#include "backend/cuda/cuda_impl.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int emc_fail(em_err *err, cudaError_t e, const char *what) {
    (void)cudaGetLastError(); /* a non-sticky error must not surface again at the next call */
    return em_err_set(err, EM_EIO, "CUDA %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int emc_use(em_gpu *g, em_err *err) {
    if (!g) return em_err_set(err, EM_EINVAL, "GPU op: no device context");
    EMC_TRY(cudaSetDevice(g->index), "cudaSetDevice");
    return 0;
}

int emc_launched(em_err *err, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return emc_fail(err, e, kernel);
    return 0;
}

extern "C" bool em_gpu_built(void) { return true; }

/* A driver that is missing or older than the runtime: EM_EUNSUPPORTED with the reason. */
static int driver_missing(cudaError_t e, em_err *err) {
    (void)cudaGetLastError();
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    return em_err_set(err, EM_EUNSUPPORTED,
                      "no usable NVIDIA driver: %s (this ember's CUDA runtime is %d.%d; is the driver installed and "
                      "the GPU visible?)",
                      cudaGetErrorString(e), rt / 1000, rt % 1000 / 10);
}

extern "C" int em_gpu_device_count(int *n, em_err *err) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e == cudaErrorNoDevice) {
        (void)cudaGetLastError();
        *n = 0;
        return 0;
    }
    if (e == cudaErrorInsufficientDriver || e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorSystemDriverMismatch)
        return driver_missing(e, err);
    if (e != cudaSuccess) return emc_fail(err, e, "cudaGetDeviceCount");
    return 0;
}

extern "C" int em_gpu_open(int index, em_gpu **out, em_err *err) {
    *out = NULL;
    int n = 0;
    int rc = em_gpu_device_count(&n, err);
    if (rc) return rc;
    if (index < 0 || index >= n)
        return em_err_set(err, EM_ENOTFOUND, "no CUDA device cuda:%d (this machine has %d%s)", index, n,
                          n == 0 ? ": no GPU visible" : n == 1 ? ", cuda:0" : "");
    cudaDeviceProp p;
    EMC_TRY(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    if (p.major < 9)
        return em_err_set(err, EM_EUNSUPPORTED,
                          "cuda:%d (%s) has compute capability %d.%d; Ember's CUDA backend needs 9.0 or later (Hopper)",
                          index, p.name, p.major, p.minor);
    em_gpu *g = (em_gpu *)calloc(1, sizeof *g);
    if (!g) return em_err_set(err, EM_ENOMEM, "GPU context");
    g->index = index;
    const char *pdl = getenv("EMBER_GPU_PDL");
    g->pdl = !(pdl && !strcmp(pdl, "0"));
    g->info.index = index;
    snprintf(g->info.name, sizeof g->info.name, "%s", p.name);
    g->info.cc_major = p.major;
    g->info.cc_minor = p.minor;
    g->info.sm_count = p.multiProcessorCount;
    g->info.total_bytes = p.totalGlobalMem;
    g->info.l2_bytes = (uint64_t)p.l2CacheSize;
    cudaDriverGetVersion(&g->info.driver_version);
    cudaError_t e = cudaSetDevice(index);
    /* A branch's kernels (a MoE layer's shared expert, a low-rank up) go before the main
     * chain's when both wait for an SM: the branch is short and the chain's next steps need
     * it at the join; decode 1.5% faster (docs/cuda.md run 55). EMBER_GPU_PRIORITY=0 gives all
     * kernels one priority. */
    int least = 0, greatest = 0;
    if (e == cudaSuccess) e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    const char *prio = getenv("EMBER_GPU_PRIORITY");
    g->prio_main = least;
    g->prio_side = prio && !strcmp(prio, "0") ? least : greatest;
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&g->main, cudaStreamNonBlocking, g->prio_main);
    g->stream = g->main;
    for (int b = 0; b < EMC_BRANCHES && e == cudaSuccess; b++) {
        e = cudaStreamCreateWithPriority(&g->side[b], cudaStreamNonBlocking, g->prio_side);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->join_ev[b], cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->fork_ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreate(&g->ev[0]);
    if (e == cudaSuccess) e = cudaEventCreate(&g->ev[1]);
    if (e != cudaSuccess) {
        rc = emc_fail(err, e, "opening the device (stream, events)");
        em_gpu_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

extern "C" void em_gpu_close(em_gpu *g) {
    if (!g) return;
    cudaSetDevice(g->index);
    if (g->main) cudaStreamSynchronize(g->main);
    for (int b = 0; b < EMC_BRANCHES; b++) {
        if (g->side[b]) cudaStreamSynchronize(g->side[b]), cudaStreamDestroy(g->side[b]);
        if (g->join_ev[b]) cudaEventDestroy(g->join_ev[b]);
    }
    if (g->fork_ev) cudaEventDestroy(g->fork_ev);
    for (int i = 0; i < 2; i++)
        if (g->ev[i]) cudaEventDestroy(g->ev[i]);
    if (g->main) cudaStreamDestroy(g->main);
    free(g);
}

extern "C" void em_gpu_set_overlap(em_gpu *g, bool on) {
    if (g) g->pdl = on;
}

extern "C" const em_gpu_info *em_gpu_get_info(const em_gpu *g) { return g ? &g->info : NULL; }

extern "C" int em_gpu_mem(em_gpu *g, uint64_t *free_bytes, uint64_t *total_bytes, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    size_t f = 0, t = 0;
    EMC_TRY(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}

extern "C" int em_gpu_alloc(em_gpu *g, uint64_t bytes, const char *what, void **d_out, em_err *err) {
    *d_out = NULL;
    int rc = emc_use(g, err);
    if (rc) return rc;
    if (bytes == 0) return em_err_set(err, EM_EINVAL, "GPU allocation of 0 bytes for %s", what ? what : "?");
    cudaError_t e = cudaMalloc(d_out, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *d_out = NULL;
        size_t f = 0, t = 0;
        cudaMemGetInfo(&f, &t);
        char a[32], b[32], c[32];
        return em_err_set(err, EM_ENOMEM, "%s: needs %s of device memory, cuda:%d has %s free (of %s)",
                          what ? what : "GPU allocation", em_format_size(bytes, a, sizeof a), g->index,
                          em_format_size(f, b, sizeof b), em_format_size(t, c, sizeof c));
    }
    if (e != cudaSuccess) {
        *d_out = NULL;
        return emc_fail(err, e, "cudaMalloc");
    }
    return 0;
}

extern "C" void em_gpu_free(em_gpu *g, void *d_ptr) {
    if (!g || !d_ptr) return;
    cudaSetDevice(g->index);
    cudaFree(d_ptr);
}

/* Host waits and captures need every branch joined (em_gpu_join). */
static int joined(const em_gpu *g, const char *what, em_err *err) {
    if (g->n_branches == 0) return 0;
    return em_err_set(err, EM_EINVAL, "GPU %s: %d branches are still forked (em_gpu_join first)", what, g->n_branches);
}

extern "C" int em_gpu_upload(em_gpu *g, void *d_dst, const void *host, uint64_t bytes, em_err *err) {
    int rc = emc_use(g, err);
    if (!rc) rc = joined(g, "upload", err);
    if (rc || bytes == 0) return rc;
    /* from pageable memory the copy has returned once host may be reused; the stream orders
     * it after earlier work, and the sync makes "host may be reused" true for pinned memory too */
    EMC_TRY(cudaMemcpyAsync(d_dst, host, bytes, cudaMemcpyHostToDevice, g->main), "cudaMemcpyAsync (upload)");
    EMC_TRY(cudaStreamSynchronize(g->main), "cudaStreamSynchronize (upload)");
    return 0;
}

extern "C" int em_gpu_download(em_gpu *g, void *host, const void *d_src, uint64_t bytes, em_err *err) {
    int rc = emc_use(g, err);
    if (!rc) rc = joined(g, "download", err);
    if (rc || bytes == 0) return rc;
    EMC_TRY(cudaMemcpyAsync(host, d_src, bytes, cudaMemcpyDeviceToHost, g->main), "cudaMemcpyAsync (download)");
    EMC_TRY(cudaStreamSynchronize(g->main), "cudaStreamSynchronize (download)");
    return 0;
}

extern "C" int em_gpu_memset(em_gpu *g, void *d_dst, int v, uint64_t bytes, em_err *err) {
    int rc = emc_use(g, err);
    if (rc || bytes == 0) return rc;
    EMC_TRY(cudaMemsetAsync(d_dst, v, bytes, g->stream), "cudaMemsetAsync");
    return 0;
}

extern "C" int em_gpu_copy(em_gpu *g, void *d_dst, const void *d_src, uint64_t bytes, em_err *err) {
    int rc = emc_use(g, err);
    if (rc || bytes == 0) return rc;
    EMC_TRY(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, g->stream), "cudaMemcpyAsync (copy)");
    return 0;
}

extern "C" int em_gpu_copy_2d(em_gpu *g, void *d_dst, uint64_t dpitch, const void *d_src, uint64_t spitch,
                              uint64_t width, uint64_t rows, em_err *err) {
    int rc = emc_use(g, err);
    if (rc || width == 0 || rows == 0) return rc;
    EMC_CHECK(d_dst && d_src && dpitch >= width && spitch >= width, "GPU 2-D copy: %llu bytes wide, pitches %llu / %llu",
              (unsigned long long)width, (unsigned long long)dpitch, (unsigned long long)spitch);
    EMC_TRY(cudaMemcpy2DAsync(d_dst, dpitch, d_src, spitch, width, rows, cudaMemcpyDeviceToDevice, g->stream),
            "cudaMemcpy2DAsync");
    return 0;
}

extern "C" int em_gpu_sync(em_gpu *g, em_err *err) {
    int rc = emc_use(g, err);
    if (!rc) rc = joined(g, "sync", err);
    if (rc) return rc;
    EMC_TRY(cudaStreamSynchronize(g->main), "cudaStreamSynchronize (a kernel failed)");
    return 0;
}

/* ---- branches ------------------------------------------------------------------------------ */

extern "C" int em_gpu_fork(em_gpu *g, int n, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    EMC_CHECK(g->n_branches == 0 && n >= 1 && n <= EMC_BRANCHES, "GPU fork: %d branches (1..%d, none open: %d are)", n,
              EMC_BRANCHES, g->n_branches);
    EMC_TRY(cudaEventRecord(g->fork_ev, g->main), "cudaEventRecord (fork)");
    for (int b = 0; b < n; b++) EMC_TRY(cudaStreamWaitEvent(g->side[b], g->fork_ev, 0), "cudaStreamWaitEvent (fork)");
    g->n_branches = n;
    return 0;
}

extern "C" int em_gpu_branch(em_gpu *g, int b, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    EMC_CHECK(b >= 0 && b <= g->n_branches, "GPU branch %d: %d are forked", b, g->n_branches);
    g->stream = b == 0 ? g->main : g->side[b - 1];
    return 0;
}

extern "C" int em_gpu_join(em_gpu *g, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    g->stream = g->main;
    for (int b = 0; b < g->n_branches; b++) {
        EMC_TRY(cudaEventRecord(g->join_ev[b], g->side[b]), "cudaEventRecord (join)");
        EMC_TRY(cudaStreamWaitEvent(g->main, g->join_ev[b], 0), "cudaStreamWaitEvent (join)");
    }
    g->n_branches = 0;
    return 0;
}

/* ---- graphs ---------------------------------------------------------------------------- */

extern "C" int em_gpu_capture_begin(em_gpu *g, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    /* thread-local mode: another thread's unrelated CUDA calls do not break this capture */
    EMC_TRY(cudaStreamBeginCapture(g->main, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    return 0;
}

extern "C" int em_gpu_capture_end(em_gpu *g, em_gpu_graph **out, em_err *err) {
    *out = NULL;
    int rc = emc_use(g, err);
    if (!rc && g->n_branches) { /* a failed capture may leave branches open: close them into it */
        em_err ignore;
        em_gpu_join(g, &ignore);
    }
    if (rc) return rc;
    cudaGraph_t graph = NULL;
    EMC_TRY(cudaStreamEndCapture(g->main, &graph), "cudaStreamEndCapture (an op in the capture failed?)");
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
    if (e != cudaSuccess) {
        cudaGraphDestroy(graph);
        return emc_fail(err, e, "cudaGraphInstantiate");
    }
    em_gpu_graph *gr = (em_gpu_graph *)calloc(1, sizeof *gr);
    if (!gr) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return em_err_set(err, EM_ENOMEM, "GPU graph");
    }
    gr->graph = graph;
    gr->exec = exec;
    *out = gr;
    return 0;
}

extern "C" int em_gpu_graph_launch(em_gpu *g, const em_gpu_graph *gr, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    if (!gr) return em_err_set(err, EM_EINVAL, "GPU graph launch: no graph");
    EMC_TRY(cudaGraphLaunch(gr->exec, g->main), "cudaGraphLaunch");
    return 0;
}

extern "C" void em_gpu_graph_free(em_gpu_graph *gr) {
    if (!gr) return;
    if (gr->exec) cudaGraphExecDestroy(gr->exec);
    if (gr->graph) cudaGraphDestroy(gr->graph);
    free(gr);
}

extern "C" int em_gpu_mark(em_gpu *g, int which, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    if (which < 0 || which > 1) return em_err_set(err, EM_EINVAL, "GPU timing mark %d (0 or 1)", which);
    EMC_TRY(cudaEventRecord(g->ev[which], g->main), "cudaEventRecord");
    return 0;
}

extern "C" int em_gpu_elapsed_ms(em_gpu *g, float *ms, em_err *err) {
    int rc = emc_use(g, err);
    if (rc) return rc;
    EMC_TRY(cudaEventSynchronize(g->ev[1]), "cudaEventSynchronize");
    EMC_TRY(cudaEventElapsedTime(ms, g->ev[0], g->ev[1]), "cudaEventElapsedTime");
    return 0;
}
