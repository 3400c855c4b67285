"""Finds the CUDA toolkit (with NCCL) for `--config=cuda` builds.

The toolkit's path comes from CUDA_PATH (default /usr/local/cuda). Without a toolkit the
repository still loads, so CPU builds never need one, but its targets fail with a clear message.
"""

def _cuda_repository_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    path = ctx.path(root)
    if path.get_child("include").get_child("cuda_runtime.h").exists:
        ctx.symlink(path.get_child("include"), "include")
        for lib in ["libcudart.so", "libnccl.so", "libcublas.so"]:
            src = path.get_child("lib64").get_child(lib)
            if not src.exists:
                fail("CUDA toolkit at %s lacks lib64/%s" % (root, lib))
            ctx.symlink(src, "lib/" + lib)
        ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

# Every file: CUDA 13's headers include extension-less ones such as nv/target.
cc_library(
    name = "cudart",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    srcs = ["lib/libcudart.so"],
)

cc_library(
    name = "nccl",
    srcs = ["lib/libnccl.so"],
    deps = [":cudart"],
)

cc_library(
    name = "cublas",
    srcs = ["lib/libcublas.so"],
    deps = [":cudart"],
)
""")
    else:
        ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

genrule(
    name = "missing",
    outs = ["missing.h"],
    cmd = "echo 'no CUDA toolkit at {root} (set CUDA_PATH)' >&2; exit 1",
)

cc_library(name = "cudart", hdrs = [":missing"])

cc_library(name = "nccl", hdrs = [":missing"])

cc_library(name = "cublas", hdrs = [":missing"])
""".format(root = root))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
