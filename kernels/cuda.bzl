"""What a build without the CUDA toolkit (--define=strata_cuda=0) leaves out."""

# target_compatible_with of every target that links the CUDA kernels or NCCL: incompatible
# without the toolkit, so `bazel test //...` skips it there (./strata lists it as skipped).
CUDA_ONLY = select({
    "//kernels:no_cuda": ["//kernels:unsatisfiable"],
    "//conditions:default": [],
})
