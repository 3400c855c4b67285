"""Fuzz targets: one source, built for libFuzzer and as a replay test (see base/fuzz_target.h).

Example:
    load("//base:fuzz.bzl", "lockstep_fuzz_target")
    lockstep_fuzz_target(name = "plan_check_fuzzer", srcs = ["plan_check_fuzzer.cc"],
                         deps = [":plan_check"])
"""

load("//third_party:cc.bzl", "cc_binary", "cc_test")
load("//third_party:labels.bzl", "lockstep_label")

def lockstep_fuzz_target(name, srcs, deps, size = "small", regressions = []):
    """Declares `name` (the fuzzer; libFuzzer under --config=fuzz) and `name + "_replay_test"`.

    `regressions`: input files that once failed (kept beside the target); the replay test runs
    them after the seeds.
    """
    cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + [lockstep_label("//base:fuzz_target")] + select({
            lockstep_label("//base:fuzzing"): [lockstep_label("//base:fuzz_seed_init"), lockstep_label("//third_party:libfuzzer")],
            "//conditions:default": [lockstep_label("//base:fuzz_replay_main")],
        }),
        tags = ["fuzz"],
    )
    cc_test(
        name = name + "_replay_test",
        size = size,
        srcs = srcs,
        data = regressions,
        args = ["--seeds"] + ["$(location %s)" % r for r in regressions],
        deps = deps + [lockstep_label("//base:fuzz_target"), lockstep_label("//base:fuzz_replay_main")],
    )
