"""lockstep's modules as shared libraries, and the tree `bazel run //install` copies into a prefix.

Note [One shared library per module]: each module (base, collectives, planner, ...) is one
`liblockstep_<module>.so` holding the objects of its own package only; the modules it uses are
linked as the shared libraries they are, so base's state (logging, the LibTorch boundary) exists
once in a process however many modules it loads. The objects are the PIC objects Bazel already
compiles for the tests' dynamic linking: an install costs a link per module. Everything outside
lockstep (LibTorch, Abseil, protobuf, glog, ...) is linked as the system or LibTorch tree has it,
and every library is linked with --no-undefined, so a module that forgets a dependency fails here
rather than in a consumer's link.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

ModuleLibraryInfo = provider(
    doc = "One lockstep module as a shared library.",
    fields = {
        "module": "the module's name (\"planner\"): the CMake target lockstep::<module>",
        "library": "File: liblockstep_<module>.so",
        "libraries": "depset of Files: this module's library and those of every module under it",
        "headers": "depset of Files: the module's headers (source and generated)",
        "module_deps": "list of module names this one links",
        "cmake_deps": "list of CMake targets (outside lockstep) a consumer of it links",
    },
)

def _owned(label, workspace, packages):
    return label.workspace_name == workspace and label.package in packages

def _module_library_impl(ctx):
    workspace = ctx.label.workspace_name
    packages = ctx.attr.packages
    deps_infos = [d[ModuleLibraryInfo] for d in ctx.attr.module_deps]
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )

    # lockstep's packages other modules provide: their objects come from those modules' libraries.
    provided = {}
    for dep in ctx.attr.module_deps:
        for p in dep[_PackagesInfo].packages:
            provided[p] = True

    objects = []
    seen = {}
    external_inputs = []
    headers = []
    for root in ctx.attr.roots:
        cc = root[CcInfo]
        for header in cc.compilation_context.headers.to_list():
            if _owned(header.owner, workspace, packages):
                headers.append(header)
        for linker_input in cc.linking_context.linker_inputs.to_list():
            owner = linker_input.owner
            if _owned(owner, workspace, packages):
                for library in linker_input.libraries:
                    for o in (library.pic_objects or library.objects or []):
                        if o.path not in seen:
                            seen[o.path] = True
                            objects.append(o)
            elif owner.workspace_name == workspace and owner.package in provided:
                continue
            elif owner.workspace_name == workspace and owner.package != "third_party":
                fail("%s: %s is in package %s, which neither this module (%s) nor its module_deps hold" %
                     (ctx.label, owner, owner.package, ", ".join(packages)))
            else:
                external_inputs.append(linker_input)

    dep_libraries = [
        cc_common.create_library_to_link(
            actions = ctx.actions,
            feature_configuration = features,
            cc_toolchain = cc_toolchain,
            dynamic_library = library,
        )
        # Every module under this one: a symbol of base used here resolves against base itself.
        for library in depset(transitive = [info.libraries for info in deps_infos]).to_list()
    ]
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset(
            [cc_common.create_linker_input(
                owner = ctx.label,
                libraries = depset(dep_libraries),
            )],
            transitive = [depset(external_inputs)],
        ),
    )
    soname = "liblockstep_%s.so" % ctx.attr.module
    linked = cc_common.link(
        actions = ctx.actions,
        name = "lockstep_" + ctx.attr.module,
        feature_configuration = features,
        cc_toolchain = cc_toolchain,
        compilation_outputs = cc_common.create_compilation_outputs(
            objects = depset(objects),
            pic_objects = depset(objects),
        ),
        linking_contexts = [linking_context],
        output_type = "dynamic_library",
        user_link_flags = ["-Wl,-soname," + soname] +
                          ([] if ctx.attr.python_extension else ["-Wl,--no-undefined"]),
    )
    library = linked.library_to_link.resolved_symlink_dynamic_library or linked.library_to_link.dynamic_library
    return [
        DefaultInfo(files = depset([library])),
        ModuleLibraryInfo(
            module = ctx.attr.module,
            library = library,
            libraries = depset([library], transitive = [info.libraries for info in deps_infos]),
            headers = depset(headers),
            module_deps = [info.module for info in deps_infos],
            cmake_deps = ctx.attr.cmake_deps,
        ),
        _PackagesInfo(packages = sorted(provided.keys() + packages)),
    ]

# The lockstep packages a module library and the modules under it hold (transitively).
_PackagesInfo = provider(fields = ["packages"])

lockstep_module_library = rule(
    implementation = _module_library_impl,
    doc = "liblockstep_<module>.so: Note [One shared library per module].",
    attrs = {
        "module": attr.string(mandatory = True),
        "packages": attr.string_list(mandatory = True, doc = "lockstep packages whose objects it holds"),
        "roots": attr.label_list(providers = [CcInfo], doc = "the module's public libraries"),
        "module_deps": attr.label_list(providers = [ModuleLibraryInfo]),
        "cmake_deps": attr.string_list(doc = "CMake targets outside lockstep its consumers link"),
        "python_extension": attr.bool(
            doc = "a CPython extension: the interpreter's symbols stay undefined (no libpython)",
        ),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
)

def _cmake_targets(modules):
    """lockstepTargets.cmake: one imported target per module, and lockstep::lockstep for all."""
    lines = [
        "# Generated by //install (install/module_library.bzl): lockstep's imported targets.",
        "# Paths are relative to this file, so the installed tree can move.",
        "get_filename_component(_lockstep_prefix \"${CMAKE_CURRENT_LIST_DIR}/../../..\" ABSOLUTE)",
        "if(NOT TARGET lockstep::lockstep)",
    ]
    for m in modules:
        links = ["lockstep::" + d for d in m.module_deps] + m.cmake_deps
        lines += [
            "  add_library(lockstep::%s SHARED IMPORTED)" % m.module,
            "  set_target_properties(lockstep::%s PROPERTIES" % m.module,
            "    IMPORTED_LOCATION \"${_lockstep_prefix}/lib/liblockstep_%s.so\"" % m.module,
            "    IMPORTED_SONAME \"liblockstep_%s.so\"" % m.module,
            "    INTERFACE_INCLUDE_DIRECTORIES \"${_lockstep_prefix}/include\"",
            "    INTERFACE_COMPILE_FEATURES \"cxx_std_17\"",
            "    INTERFACE_LINK_LIBRARIES \"%s\")" % ";".join(links),
        ]
    lines += [
        "  add_library(lockstep::lockstep INTERFACE IMPORTED)",
        "  set_target_properties(lockstep::lockstep PROPERTIES",
        "    INTERFACE_LINK_LIBRARIES \"%s\")" % ";".join(["lockstep::" + m.module for m in modules]),
        "endif()",
        "unset(_lockstep_prefix)",
        "",
    ]
    return "\n".join(lines)

def _install_path(f):
    # A header's path from its repository's root: "planner/plan.pb.h", whether lockstep is the
    # main repository or an external one ("../lockstep/planner/plan.pb.h" in runfiles terms).
    path = f.short_path
    if path.startswith("../"):
        path = path.split("/", 2)[2]
    return path

def _install_tree_impl(ctx):
    modules = [m[ModuleLibraryInfo] for m in ctx.attr.modules]
    tree = ctx.actions.declare_directory(ctx.label.name)
    targets = ctx.actions.declare_file(ctx.label.name + "_lockstepTargets.cmake")
    ctx.actions.write(targets, _cmake_targets(modules))
    entries = []  # "source<TAB>destination" lines for make_tree.sh
    inputs = [targets, ctx.file.config, ctx.file.version_template, ctx.file.version]
    for m in modules:
        entries.append("%s\tlib/%s\tlibrary" % (m.library.path, m.library.basename))
        inputs.append(m.library)
        for h in m.headers.to_list():
            entries.append("%s\tinclude/%s\tfile" % (h.path, _install_path(h)))
            inputs.append(h)
    for h in ctx.files.extra_headers:
        entries.append("%s\tinclude/%s\tfile" % (h.path, _install_path(h)))
        inputs.append(h)
    entries.append("%s\tlib/cmake/lockstep/lockstepTargets.cmake\tfile" % targets.path)
    entries.append("%s\tlib/cmake/lockstep/lockstepConfig.cmake\tfile" % ctx.file.config.path)
    entries.append("%s\tlib/cmake/lockstep/lockstepConfigVersion.cmake\tversion" %
                   ctx.file.version_template.path)
    spec = ctx.actions.declare_file(ctx.label.name + ".spec")
    ctx.actions.write(spec, "\n".join(entries) + "\n")
    ctx.actions.run(
        executable = ctx.executable._make_tree,
        arguments = [spec.path, tree.path, ctx.file.version.path],
        inputs = inputs + [spec],
        outputs = [tree],
        mnemonic = "LockstepInstallTree",
        progress_message = "Laying out lockstep's install tree",
        use_default_shell_env = True,  # patchelf from the system
    )
    return [DefaultInfo(files = depset([tree]), runfiles = ctx.runfiles(files = [tree]))]

lockstep_install_tree = rule(
    implementation = _install_tree_impl,
    doc = "The tree `bazel run //install` copies into a prefix: lib/, include/, lib/cmake/lockstep.",
    attrs = {
        "modules": attr.label_list(providers = [ModuleLibraryInfo]),
        "extra_headers": attr.label_list(allow_files = [".h"]),
        "config": attr.label(allow_single_file = True, mandatory = True),
        "version_template": attr.label(allow_single_file = True, mandatory = True),
        "version": attr.label(allow_single_file = True, mandatory = True),
        "_make_tree": attr.label(default = ":make_tree", executable = True, cfg = "exec"),
    },
)
