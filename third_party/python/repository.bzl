"""Finds the Python that lockstep's Python package is built for.

The package (//python) is a pybind11 extension over lockstep's C++ libraries, linked to the
libtorch_python of the same LibTorch that @libtorch finds, so tensors, generators and
torch.distributed's process groups cross between Python and C++ without copies. By default
Debian's Python 3 (python3-dev) and python3-torch; `--repo_env=PYTHON_INCLUDE=DIR` names another
Python's headers (the GPU build points it at the device's Python), and with
`--repo_env=LIBTORCH=DIR` libtorch_python comes from `DIR/lib`. The repository exposes:
  @python//:headers       Python.h and its neighbours
  @python//:torch_python  libtorch_python (and the headers)
"""

def _python_repository_impl(ctx):
    include = ctx.os.environ.get("PYTHON_INCLUDE", "")
    if not include:
        found = ctx.execute(["/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"])
        if found.return_code != 0:
            fail("no /usr/bin/python3 to take the headers from; run ./setup.sh or set PYTHON_INCLUDE")
        include = found.stdout.strip()
    if not ctx.path(include + "/Python.h").exists:
        fail("%s has no Python.h; run ./setup.sh (python3-dev) or set PYTHON_INCLUDE" % include)
    ctx.symlink(include, "include")
    # The Python the headers are of ("3.12"): the wheel's python and ABI tags (cp312).
    patchlevel = ctx.read(include + "/patchlevel.h")
    version = []
    for key in ["PY_MAJOR_VERSION", "PY_MINOR_VERSION"]:
        at = patchlevel.find("#define " + key)
        if at < 0:
            fail("%s/patchlevel.h does not define %s" % (include, key))
        version.append(patchlevel[at + len("#define " + key):].split("\n")[0].strip())
    ctx.file("build_facts.txt", "python_version=%s\n" % ".".join(version))
    root = ctx.os.environ.get("LIBTORCH", "")
    torch_python = root + "/lib/libtorch_python.so" if root else "/usr/lib/x86_64-linux-gnu/libtorch_python.so"
    has_torch_python = ctx.path(torch_python).exists
    if has_torch_python:
        ctx.symlink(torch_python, "lib/libtorch_python.so")
    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

exports_files(["build_facts.txt"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "torch_python",
    srcs = [{lib}],
    deps = [":headers", "@libtorch//:torch"],
)
""".format(lib = '"lib/libtorch_python.so"' if has_torch_python else ""))

python_repository = repository_rule(
    implementation = _python_repository_impl,
    environ = ["PYTHON_INCLUDE", "LIBTORCH"],
    local = True,
)
