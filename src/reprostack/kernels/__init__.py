"""Stage `kernels`: build NCCL and DeepEP's `_C` from patched source trees into a keyed cache.

recipe (kernels/<component>.yaml) -> toolchain (nvcc, torch, GPU arch) -> preflight -> build
(nccl, deepep) -> runtime (the environment in which exactly one NCCL, the pinned one, is loaded).
"""
