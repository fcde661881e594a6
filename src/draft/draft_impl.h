/* draft/ internals shared by its files (not part of the interface). */
#ifndef EM_DRAFT_IMPL_H
#define EM_DRAFT_IMPL_H

#include "draft/draft.h"

#define EM_DRAFT_DEFAULT_CTX 4096

/* The DSpark/DFlash drafter (dspark.c). opts is complete (no zeros left to default). */
int em_dspark_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                   const em_draft_opts *opts, em_err *err);
/* The same drafter on CUDA device cuda_index (dspark_cuda.c): EM_EUNSUPPORTED without CUDA or
 * for what it does not run yet, naming it. */
int em_dspark_cuda_open(em_drafter **out, const char *draft_path, const em_target_shared *target,
                        const em_draft_opts *opts, int cuda_index, em_err *err);
/* The layers a dflash file taps (dspark_load.c), for em_draft_read_taps. */
int em_dspark_read_taps(const char *draft_path, int *taps, int *n_taps, em_err *err);

#endif
