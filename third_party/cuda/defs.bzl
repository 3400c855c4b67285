"""Build settings for code that exists only in --config=cuda builds."""

def cuda_only():
    """`target_compatible_with` for targets that build only under --config=cuda.

    Elsewhere the target is incompatible, so `bazel build //...` skips it instead of failing.
    """
    return select({
        "//third_party:cuda_enabled": [],
        "//conditions:default": ["//third_party:incompatible"],
    })

def built_with_cuda_defines():
    """`local_defines` telling a target whether lockstep's CUDA halves are linked in."""
    return select({
        "//third_party:cuda_enabled": ["LOCKSTEP_BUILT_WITH_CUDA=1"],
        "//conditions:default": ["LOCKSTEP_BUILT_WITH_CUDA=0"],
    })

def cuda_kernel_object(name, src, hdrs):
    """A genrule compiling lockstep's own kernel `src` with the toolkit's nvcc for the H200.

    sm_90 code plus compute_90 PTX. Warnings are errors, as for the project's C++ code: nvcc's own
    (`-Werror all-warnings`) and the host compiler's (`-Wall -Wextra -Werror`). The object is
    `<name>.o`; the target builds only under --config=cuda.
    """
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        cmd = ("$${CUDA_PATH:-/usr/local/cuda}/bin/nvcc -std=c++17 -O3 -I. " +
               "-Werror all-warnings -Xcompiler -fPIC,-Wall,-Wextra,-Werror " +
               "-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 " +
               "-c $(location " + src + ") -o $@"),
        target_compatible_with = cuda_only(),
    )
