/* NCCL inside a host, seen from plain C (the CUDA backend's TP / KVP collectives on
 * device buffers), and the device twin of reference/ops.h's ops_tree_sum. No CUDA or NCCL
 * types: a communicator is an opaque struct, a stream a void * (cudaStream_t), an id
 * CUDA_NCCL_ID_BYTES bytes (an ncclUniqueId) that the caller moves between ranks itself
 * (runtime/stage/nccl_group.c broadcasts it over wire/collective), so kernels/ needs no
 * network code.
 *
 * Determinism (the project's guarantee): only operations whose result has one possible bit
 * pattern are used. ncclAllGather copies; cuda_ops_tree_sum adds the gathered parts in
 * ops_tree_sum's order. ncclAllReduce is used for two ranks only: each element is then one
 * correctly rounded fp32 addition, x0 + x1 == x1 + x0, whatever algorithm NCCL picks (ring,
 * tree, NVLS); with more ranks NCCL's order depends on its algorithm and chunking, so a sum
 * of more than two parts is an all-gather and the tree.
 *
 * Failure: a rank that never joins or dies leaves an NCCL kernel waiting forever on the
 * device. Every blocking step here therefore polls with a deadline: the communicator is
 * created non-blocking (ncclConfig_t.blocking = 0) and polled until ready; a stream is waited
 * for by polling it and the communicator's asynchronous error. At the deadline, or on an
 * asynchronous error, the communicator is aborted (ncclCommAbort, which also ends its pending
 * kernels) and every later call fails at once. Every call returns 0 or a negative STRATA_E*
 * status (STRATA_EDEVICE, STRATA_ETIMEOUT, STRATA_EINVAL) with the rank in the message. */
#ifndef STRATA_KERNELS_NCCL_H
#define STRATA_KERNELS_NCCL_H

#include <stddef.h>
#include <stdint.h>

#define CUDA_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES) */

struct cuda_nccl_comm;

/* 1 when this build can use NCCL (the library loads and reports its version into
 * reason[cap], e.g. "NCCL 2.28.9"); else 0 with the reason. Says nothing about devices. */
int cuda_nccl_available(char *reason, size_t cap);

/* A fresh id (ncclGetUniqueId): drawn by one rank of a group and sent to the others. */
int cuda_nccl_unique_id(uint8_t id[CUDA_NCCL_ID_BYTES]);

/* Joins rank `rank` of `size` ranks to the communicator of `id` on the calling thread's
 * current device (cuda_set_device). Every rank must call it within timeout_ms (>= 1) of the
 * others; otherwise STRATA_ETIMEOUT and nothing is left behind. One rank per device (NCCL
 * refuses two ranks of a communicator on one GPU). `label` names the group in messages. */
int cuda_nccl_comm_init(struct cuda_nccl_comm **out, const uint8_t id[CUDA_NCCL_ID_BYTES], int size,
                        int rank, int timeout_ms, const char *label);

/* Finalizes and frees (waits for pending operations up to the communicator's timeout, then
 * aborts); accepts NULL. */
void cuda_nccl_comm_destroy(struct cuda_nccl_comm *c);
/* Aborts pending operations (a kernel waiting on a dead peer returns) and frees; accepts
 * NULL. For a group whose other channel (wire/collective) has failed. */
void cuda_nccl_comm_abort(struct cuda_nccl_comm *c);

int cuda_nccl_rank(const struct cuda_nccl_comm *c);
int cuda_nccl_size(const struct cuda_nccl_comm *c);

/* Device buffers, asynchronous on `stream`. out[size * n] <- every rank's in[n], rank r's at
 * out + r·n (`in` may be out + rank·n). Bitwise copies. */
int cuda_nccl_allgather(struct cuda_nccl_comm *c, float *out, const float *in, size_t n,
                        void *stream);
/* data[n] <- x0 + x1 in place: two ranks only (see the top of the file); STRATA_EINVAL
 * otherwise. */
int cuda_nccl_allreduce_sum2(struct cuda_nccl_comm *c, float *data, size_t n, void *stream);

/* Waits for everything queued on `stream` (NCCL operations included) for at most timeout_ms:
 * STRATA_ETIMEOUT (the communicator is then aborted: a peer never answered) or the
 * communicator's asynchronous error (also aborted) or the stream's own error. */
int cuda_nccl_stream_wait(struct cuda_nccl_comm *c, void *stream, int timeout_ms);

/* The twin of reference/ops.h ops_tree_sum on device buffers: out[n] <- the balanced tree of
 * parts[count][n] (count a power of two <= OPS_SPLIT_LEAVES), out may equal parts. Bitwise
 * ops_tree_sum (--fmad=false, __fadd_rn). Asynchronous on `stream`. */
int cuda_ops_tree_sum(float *out, const float *parts, int count, size_t n, void *stream);

#endif
