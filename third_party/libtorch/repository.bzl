"""Finds LibTorch for the build.

By default Debian's LibTorch (package libtorch-dev) under /usr; `--repo_env=LIBTORCH=DIR` selects
any LibTorch tree with the pip/zip layout (`DIR/include`, `DIR/lib`), such as the GPU SDK that
../shared/gpu-sdk/make-sdk.sh lays out. The repository exposes one target per library set:
  @libtorch//:torch       headers + libtorch, libtorch_cpu, libc10
  @libtorch//:torch_cuda  libtorch_cuda, libc10_cuda (only in trees that have them)
"""

load("//third_party:labels.bzl", "lockstep_label")

_DEBIAN_HEADER_DIRS = ["ATen", "c10", "caffe2", "torch"]
_SHADOWING_HEADER_DIRS = ["google"]
_CORE_LIBS = ["libtorch.so", "libtorch_cpu.so", "libc10.so"]
_CUDA_LIBS = ["libtorch_cuda.so", "libc10_cuda.so"]

def _libtorch_repository_impl(ctx):
    root = ctx.os.environ.get("LIBTORCH", "")
    if root:
        include_dir = ctx.path(root + "/include")
        lib_dir = ctx.path(root + "/lib")
        if not include_dir.exists or not lib_dir.exists:
            fail("LIBTORCH=%s is not a LibTorch tree: it needs include/ and lib/" % root)
        # Every header directory but the protobuf headers bundled in pip/zip trees: lockstep
        # uses the system protobuf, whose headers those would shadow.
        for child in include_dir.readdir():
            if child.basename not in _SHADOWING_HEADER_DIRS:
                ctx.symlink(child, "include/" + child.basename)
        for lib in _CORE_LIBS + _CUDA_LIBS:
            if lib_dir.get_child(lib).exists:
                ctx.symlink(lib_dir.get_child(lib), "lib/" + lib)
    else:
        # Debian installs the headers into /usr/include beside everything else: link only
        # LibTorch's own directories so the repository does not shadow the system headers.
        for d in _DEBIAN_HEADER_DIRS:
            path = ctx.path("/usr/include/" + d)
            if not path.exists:
                fail("Debian's LibTorch headers are missing (%s); run ./setup.sh or set LIBTORCH" % path)
            ctx.symlink(path, "include/" + d)
        for lib in _CORE_LIBS:
            ctx.symlink("/usr/lib/x86_64-linux-gnu/" + lib, "lib/" + lib)

    has_cuda = ctx.path("lib/libtorch_cuda.so").exists

    # A LibTorch built with glog (Debian's) includes glog's headers from c10/util/Logging.h.
    macros = ctx.path("include/c10/macros/cmake_macros.h")
    uses_glog = macros.exists and "#define C10_USE_GLOG" in ctx.read(macros)
    # The C++ ABI the tree was built with (std::string and friends are different types under
    # each): code that includes LibTorch's headers must match it, so the define travels with the
    # target rather than with a .bazelrc a consumer would have to copy. Read from libc10's
    # symbols: the new ABI's names live in std::__cxx11.
    c10 = ctx.path("lib/libc10.so")
    abi = 1 if ctx.execute(["grep", "-q", "_ZNSt7__cxx11", str(c10.realpath)]).return_code == 0 else 0
    # The release the headers declare ("2.11.0"): a wheel requires exactly it (LibTorch's C++ ABI
    # changes between releases) and lockstep checks it at import (//python:package's _build.py).
    # torch 2.x moved the defines to torch/headeronly/version.h, which the old header includes.
    release = ""
    text = ""
    for header in ["include/torch/headeronly/version.h", "include/torch/csrc/api/include/torch/version.h"]:
        if not text and ctx.path(header).exists:
            text = ctx.read(ctx.path(header))
    if text:
        parts = []
        for key in ["TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"]:
            at = text.find("#define " + key + " ")
            if at >= 0:
                parts.append(text[at + len("#define " + key + " "):].split("\n")[0].strip())
        release = ".".join(parts) if len(parts) == 3 else ""
    ctx.file("build_facts.txt", "torch_release=%s\ncxx11_abi=%d\ncuda=%d\n" % (release, abi, 1 if has_cuda else 0))
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

exports_files(["build_facts.txt"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**"], exclude = ["include/**/*.cpp", "include/**/*.cu"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"],
    srcs = [{core}],
    # libtorch registers operators from static initializers: keep it even if no symbol is used.
    linkopts = ["-Wl,--no-as-needed", "-lpthread"],
    deps = [{glog}],
)

cc_library(
    name = "torch_cuda",
    srcs = [{cuda}],
    linkopts = ["-Wl,--no-as-needed"],
    deps = [":torch"],
)
""".format(
        core = ", ".join(['"lib/%s"' % l for l in _CORE_LIBS]),
        glog = '"%s"' % lockstep_label("//third_party:glog") if uses_glog else "",
        abi = abi,
        cuda = ", ".join(['"lib/%s"' % l for l in _CUDA_LIBS]) if has_cuda else "",
    ))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH"],
    local = True,
)
