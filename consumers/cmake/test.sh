#!/usr/bin/env bash
# consumers/cmake/test.sh: lockstep installed with `bazel run //install` and used by a CMake
# project, as README's "Using lockstep in your project" says. Run from the repository root (by
# .ci/run after lockstep's own tests); extra arguments go to `bazel run` (-c opt, --config=...).
# Each check prints "cmake consumer: <check> PASSED", "... FAILED: why" or "... NOT RUN: why" (it
# could not run all of its subject); exits non-zero if any failed. Checks:
#   install        the install succeeds and its manifest lists exactly the files it laid down
#   no_build_paths no installed file names the checkout, Bazel's output base or its exec root
#   reinstall      a second install over the first removes what only the first had, keeps the rest
#   versions       find_package(lockstep 0.1) is met; 0.2 and 1.0 are refused
#   service_test   after the prefix is moved elsewhere, the consumer (../bazel/service, built by
#                  consumers/cmake/CMakeLists.txt) configures, builds and passes its test, with
#                  lockstep's libraries loaded from the moved prefix; NOT RUN if the test
#                  skipped a case (its GPU case where there is no GPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$(mktemp -d)
trap '[[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"' EXIT
failures=0
pass() { echo "cmake consumer: $1 PASSED"; }
fail() { echo "cmake consumer: $1 FAILED: $2"; failures=$((failures + 1)); }
not_run() { echo "cmake consumer: $1 NOT RUN: $2"; }
manifest_matches() {  # prefix: the manifest lists exactly the prefix's files
  local prefix=$1
  diff <(cut -c67- "$prefix/lib/cmake/lockstep/install_manifest.txt" | sort) \
       <(cd "$prefix" && find . -type f ! -path ./lib/cmake/lockstep/install_manifest.txt |
         sed 's|^\./||' | sort) > "$work/manifest.diff"
}

prefix=$work/first
if bazel run "$@" //install -- --prefix="$prefix" > "$work/install.log" 2>&1 && manifest_matches "$prefix"; then
  pass install
  tail -1 "$work/install.log"
else
  fail install "see below"; tail -20 "$work/install.log" "$work/manifest.diff" 2>/dev/null
fi

leaks=$(grep -rlF -e "$root" -e "$(bazel info output_base 2>/dev/null)" \
  -e "$(bazel info execution_root 2>/dev/null)" "$prefix" 2>/dev/null || true)
# Nor does a library's run-time search path name Bazel's tree: only $ORIGIN (the modules beside it).
for library in "$prefix"/lib/liblockstep_*.so; do
  runpath=$(readelf -d "$library" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  [[ $runpath == '$ORIGIN' ]] || leaks+=" ${library##*/} (run path '$runpath')"
done
if [[ -d $prefix && -z $leaks ]]; then pass no_build_paths; else fail no_build_paths "${leaks:-no install}"; fi

# A file only an earlier install had (listed in its manifest) goes; the rest stays, replaced.
mkdir -p "$prefix/include/planner/old"
echo "// from an earlier install" > "$prefix/include/planner/old/removed.h"
(cd "$prefix" && sha256sum include/planner/old/removed.h) >> "$prefix/lib/cmake/lockstep/install_manifest.txt"
echo "kept" > "$prefix/not_locksteps.txt"  # not in the manifest: not lockstep's to remove
if bazel run "$@" //install -- --prefix="$prefix" > "$work/reinstall.log" 2>&1 &&
   [[ ! -e $prefix/include/planner/old && -f $prefix/not_locksteps.txt &&
      -f $prefix/lib/liblockstep_planner.so ]]; then
  rm "$prefix/not_locksteps.txt"
  if manifest_matches "$prefix" && ! ls -a "$prefix" | grep -q '^\.lockstep-install'; then
    pass reinstall
  else
    fail reinstall "the manifest or the prefix differs after the second install"
  fi
else
  fail reinstall "the stale file survived or the install failed"; tail -5 "$work/reinstall.log"
fi

# The installed tree moves: everything is found relative to the config file.
moved=$work/moved/elsewhere
mkdir -p "$(dirname "$moved")" && mv "$prefix" "$moved"

version_check() {  # VERSION: 0 when find_package(lockstep VERSION) succeeds against $moved
  mkdir -p "$work/v$1"
  printf 'cmake_minimum_required(VERSION 3.18)\nproject(v CXX)\nfind_package(Torch REQUIRED)\nfind_package(lockstep %s REQUIRED)\n' \
    "$1" > "$work/v$1/CMakeLists.txt"
  cmake -S "$work/v$1" -B "$work/v$1/build" -DCMAKE_PREFIX_PATH="$moved" > "$work/v$1.log" 2>&1
}
if version_check 0.1 && ! version_check 0.2 && ! version_check 1.0 &&
   grep -q 'version: 0\.1\.0' "$work/v0.2.log"; then
  pass versions
else
  fail versions "0.1 should be met, 0.2 and 1.0 refused"; tail -5 "$work/v0.1.log"
fi

build=$work/build
if cmake -S consumers/cmake -B "$build" -DCMAKE_PREFIX_PATH="$moved" > "$work/cmake.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" >> "$work/cmake.log" 2>&1 &&
   [[ $(ldd "$build/service_test") == *"liblockstep_planner.so => $moved/lib/"* ]] &&
   (cd "$build" && GTEST_OUTPUT="xml:$work/service_test.xml" ctest --output-on-failure) \
     >> "$work/cmake.log" 2>&1; then
  grep -E "tests passed|Test #" "$work/cmake.log"
  # A case the test skipped (GTEST_SKIP: its GPU case on a machine without one) did not run:
  # the check is then not run, never passed (the not-run convention, docs/building.md).
  skipped=$(/usr/bin/python3 - "$work/service_test.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
skipped = []
for c in cases:
    skip = c.find("skipped")
    if skip is not None or c.get("result") == "skipped":
        why = (skip.get("message") if skip is not None else "") or "skipped"
        why = ": ".join(line.strip() for line in why.strip().splitlines())  # file:line: why
        skipped.append(f"{c.get('classname')}.{c.get('name')}: {why}")
if skipped:
    print(f"{len(skipped)} of {len(cases)} cases skipped: " + "; ".join(skipped))
PY
  ) || skipped="its test's XML (GTEST_OUTPUT) could not be read"
  if [[ -n $skipped ]]; then not_run service_test "$skipped"; else pass service_test; fi
else
  fail service_test "see below"; tail -30 "$work/cmake.log"
fi
exit $((failures > 0))
