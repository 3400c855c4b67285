"""Everything lockstep's build needs from outside its repository, for its own workspace and for
any workspace that uses lockstep as an external repository.

    local_repository(name = "lockstep", path = "/path/to/lockstep")
    load("@lockstep//:repositories.bzl", "lockstep_dependencies")
    lockstep_dependencies()

Each repository is defined only where the workspace has not already defined one of that name, so
a consumer that brings its own LibTorch (`libtorch`, with a `:torch` target), CUDA or rule sets
keeps them. The repositories:
  rules_cc, rules_java, rules_proto, rules_python, remote_coverage_tools
      offline stand-ins (third_party/bazel/): Debian's Bazel 4 would download these
  libtorch   Debian's LibTorch, or the tree named by --repo_env=LIBTORCH=DIR
  cuda       the CUDA toolkit with NCCL ($CUDA_PATH, default /usr/local/cuda); only
             --config=cuda builds link it
  python     Python's headers and libtorch_python, for lockstep's Python package only
"""

load("//third_party/cuda:repository.bzl", "cuda_repository")
load("//third_party/libtorch:repository.bzl", "libtorch_repository")
load("//third_party/python:repository.bzl", "python_repository")

def _stand_in_impl(ctx):
    # The stand-in's directory inside lockstep's repository, wherever that repository is.
    source = ctx.path(ctx.attr._anchor).dirname.get_child("third_party").get_child("bazel")
    source = source.get_child(ctx.attr.directory)
    if not source.exists:
        fail("lockstep's stand-in %s is missing" % source)
    for child in source.readdir():
        ctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {
        "directory": attr.string(mandatory = True),
        "_anchor": attr.label(default = Label("//:repositories.bzl")),
    },
    local = True,
)

_STAND_INS = ["rules_cc", "rules_java", "rules_proto", "rules_python", "remote_coverage_tools"]

def lockstep_dependencies():
    """Defines the repositories lockstep needs that the workspace has not defined itself."""
    existing = native.existing_rules()
    for name in _STAND_INS:
        if name not in existing:
            _stand_in(name = name, directory = name)
    if "libtorch" not in existing:
        libtorch_repository(name = "libtorch")
    if "cuda" not in existing:
        cuda_repository(name = "cuda")
    if "python" not in existing:
        python_repository(name = "python")
