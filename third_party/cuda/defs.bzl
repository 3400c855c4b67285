"""Build settings for code that exists only in --config=cuda builds."""

load("//third_party:labels.bzl", "lockstep_label", "lockstep_repository_root")

def cuda_only():
    """`target_compatible_with` for targets that build only under --config=cuda.

    Elsewhere the target is incompatible, so `bazel build //...` skips it instead of failing.
    """
    return select({
        lockstep_label("//third_party:cuda_enabled"): [],
        "//conditions:default": [lockstep_label("//third_party:incompatible")],
    })

def built_with_cuda_defines():
    """`local_defines` telling a target whether lockstep's CUDA halves are linked in."""
    return select({
        lockstep_label("//third_party:cuda_enabled"): ["LOCKSTEP_BUILT_WITH_CUDA=1"],
        "//conditions:default": ["LOCKSTEP_BUILT_WITH_CUDA=0"],
    })

def cuda_kernel_object(name, src, hdrs):
    """A genrule compiling lockstep's own kernel `src` with the toolkit's nvcc for the H200.

    sm_90 code plus compute_90 PTX. Warnings are errors, as for the project's C++ code: nvcc's own
    (`-Werror all-warnings`) and the host compiler's (`-Wall -Wextra -Werror`). The object is
    `<name>.o`; the target builds only under --config=cuda.
    """
    root = lockstep_repository_root()
    own = root == "."
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        # Warnings are errors in lockstep's own workspace only: a consumer's newer compiler may
        # warn where this one does not, and must still build.
        cmd = ("$${CUDA_PATH:-/usr/local/cuda}/bin/nvcc -std=c++17 -O3 -I" + root + " " +
               ("-Werror all-warnings -Xcompiler -fPIC,-Wall,-Wextra,-Werror " if own else
                "-Xcompiler -fPIC ") +
               "-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 " +
               "-c $(location " + src + ") -o $@"),
        target_compatible_with = cuda_only(),
    )
