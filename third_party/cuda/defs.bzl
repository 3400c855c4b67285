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
