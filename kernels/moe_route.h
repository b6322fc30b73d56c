/* CUDA twin of reference/ops.h moe_route (naming convention: kernels/README.md).
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MOE_ROUTE_H
#define STRATA_KERNELS_MOE_ROUTE_H

/* MoE routing of one token (spec §4): p = softmax(router_logits [E]); the top_k largest
 * (descending; equal values keep the lower expert index first); if renormalize, divided by
 * their sum. experts [top_k], weights [top_k], router_logits [E]: device pointers.
 * One thread runs the reference's algorithm verbatim; expf is CUDA's (within 2 ulp of
 * glibc's), so near-ties may order differently from the reference. Asynchronous on
 * `stream`; 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
                   int num_experts, int top_k, void *stream);

/* Not a reference op: moe_route of each of n tokens, one thread per token (a row's result
 * never depends on the others). experts [n, top_k], weights [n, top_k], router_logits
 * [n, E]. The stage backend routes a MoE layer's rows with it on the device, so a decode
 * step needs no host round trip (runtime/stage/backend_cuda_moe.c). */
int cuda_moe_route_rows(int *experts, float *weights, const float *router_logits, int renormalize,
                        int num_experts, int top_k, int n, void *stream);

#endif
