"""Labels of lockstep's own targets, written so that they resolve inside lockstep's repository.

A label string in a macro resolves in the package that calls the macro, and one written into a
generated BUILD file resolves in the generated repository; lockstep may be the main repository or
an external one (`@lockstep`) of a consumer's workspace. `lockstep_label("//third_party:glog")`
is "@//third_party:glog" in lockstep's own workspace and "@lockstep//third_party:glog" in a
consumer's: the same target either way.
"""

def lockstep_label(label):
    """The absolute form of `label`, a label inside lockstep's repository."""
    resolved = Label(label)
    return "@%s//%s:%s" % (resolved.workspace_name, resolved.package, resolved.name)

def lockstep_repository_root():
    """The execution-root path of the repository whose BUILD file is being evaluated.

    "." for the main repository, "external/NAME" for an external one: where its source files and
    (under $(GENDIR)) its generated files are.
    """
    name = native.repository_name()
    return "." if name == "@" else "external/" + name[1:]
