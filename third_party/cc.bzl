"""lockstep's C++ rules: the native ones, with what lockstep's code needs from the compiler.

Every BUILD file of lockstep loads cc_library, cc_test and cc_binary from here (they shadow the
native rules of the same names), and so do lockstep's macros (cc_proto, the fuzz targets).

Note [C++17 travels with the targets]: lockstep's code (and LibTorch's headers) need C++17,
which the Bazel this project targets does not compile by default. In lockstep's own workspace
.bazelrc sets it for every target, host tools and third-party code included. As an external
repository of a consumer's workspace, lockstep's .bazelrc is not read, so each of lockstep's
targets carries `-std=c++17` itself: a consumer copies no flag from lockstep. (Added only there,
so lockstep's own actions, and their cache, stay as they are.) The LibTorch C++ ABI define
travels on @libtorch//:torch (third_party/libtorch/repository.bzl); -Werror stays in lockstep's
own .bazelrc, so a consumer whose compiler warns more still builds.
"""

def lockstep_copts(copts = None):
    """`copts` with what Note [C++17 travels with the targets] adds outside lockstep's workspace."""
    own = native.repository_name() == "@"
    return (copts or []) + ([] if own else ["-std=c++17"])

def cc_library(copts = None, **kwargs):
    native.cc_library(copts = lockstep_copts(copts), **kwargs)

def cc_test(copts = None, **kwargs):
    native.cc_test(copts = lockstep_copts(copts), **kwargs)

def cc_binary(copts = None, **kwargs):
    native.cc_binary(copts = lockstep_copts(copts), **kwargs)
