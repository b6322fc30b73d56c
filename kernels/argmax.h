/* CUDA twin of reference/sampler.h argmax (naming convention: kernels/README.md): greedy
 * decoding on the device, so a decode step copies back one id per row instead of V logits.
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_ARGMAX_H
#define STRATA_KERNELS_ARGMAX_H

#include <stdint.h>

/* *out = argmax(x [n]) exactly as the reference's sequential scan `if (x[i] > x[best])
 * best = i` from best = 0: the first maximal index (torch.argmax, spec §7); NaN never wins
 * a comparison, so a NaN at index 0 gives 0 and any other NaN is passed over; -0 and +0
 * are equal (the first wins). The parallel reduction keeps (value, index) pairs and breaks
 * equal values towards the lower index, which reproduces that scan bit for bit (only
 * comparisons, no arithmetic): the id is always the reference's. out is one device int32,
 * x a device pointer, n >= 1. Asynchronous on `stream`; 0 or STRATA_EINVAL /
 * STRATA_EDEVICE. */
int cuda_argmax(int32_t *out, const float *x, int n, void *stream);

/* Not a reference op: out [n_rows] = cuda_argmax of each row of x [n_rows, n], one block
 * per row. */
int cuda_argmax_rows(int32_t *out, const float *x, int n_rows, int n, void *stream);

/* Twin of reference/sampler.h argmax_part, per row (the vocab-parallel greedy argmax of a TP
 * head): pairs [n_rows][2] <- each row of x [n_rows, n] (the ids [start, start + n)
 * of a vocabulary split in id order) reduced to its candidate, (value, global index) with
 * the index as a float (exact below 2^24: the caller checks the vocabulary). start == 0:
 * cuda_argmax's pick and its value (NaN when x[0] is); start > 0: the first largest non-NaN
 * value, or (0, -1) when the row has none. argmax_merge over the parts' pairs in id order
 * then gives argmax() of the whole row. Comparisons only, like cuda_argmax; asynchronous on
 * `stream`. */
int cuda_argmax_part_rows(float *pairs, const float *x, int n_rows, int n, int start, void *stream);

#endif
