/* CUDA twin of reference/ops.h moe_route (naming convention: kernels/README.md).
 * Plain C header: no CUDA types. */
#ifndef STRATA_KERNELS_MOE_ROUTE_H
#define STRATA_KERNELS_MOE_ROUTE_H

/* MoE routing of one token (spec §4): p = softmax(router_logits [E]); the top_k largest
 * (descending; equal values keep the lower expert index first); if renormalize, divided by
 * their sum. experts [top_k], weights [top_k], router_logits [E]: device pointers.
 * One thread runs the reference's algorithm verbatim; expf is CUDA's (within 2 ulp of
 * glibc's), so near-ties may order differently from the reference. The stage backend
 * routes on the host with the reference op (it needs the expert ids there to group
 * tokens); this twin is for device-side use and the harness. Asynchronous on `stream`;
 * 0 or STRATA_EINVAL / STRATA_EDEVICE. */
int cuda_moe_route(int *experts, float *weights, const float *router_logits, int renormalize,
                   int num_experts, int top_k, void *stream);

#endif
