#!/usr/bin/env bash
# The GPU bundle's run.sh (tools/gpu_bundle.sh puts it in .gpu-bundle/): runs every test in bin/
# (the *_test executables; the tools and benchmarks there need arguments) or those named on the
# GPU machine, against its LibTorch, CUDA and NCCL, as
# ../shared/gpu-sdk/run-bundle.sh does, and also reads each GoogleTest binary's XML so that tests
# that could not run here (GTEST_SKIP: too few GPUs, a CPU-only build's refusals) are reported as
# not run, by name and reason, never counted as passed. Ends with
#   N passed, N failed, N tests not run
# (binaries passed and failed; tests skipped), exiting non-zero on any failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
libs=$here/lib:$site/torch/lib:/usr/local/cuda/lib64
for d in "$site"/nvidia/*/lib; do libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=${OUT:-$here/logs}; mkdir -p "$logs"
passed=0 failed=0 not_run=0
not_run_lines=()
if [[ $# -gt 0 ]]; then tests=("$@"); else tests=("$here"/bin/*_test); fi
for t in "${tests[@]}"; do
  [[ -f $t && -x $t ]] || t=$here/bin/$t
  [[ -f $t && -x $t ]] || continue
  name=$(basename "$t")
  xml=$logs/$name.xml
  rm -f "$xml"
  if (cd "$(dirname "$t")" && GTEST_OUTPUT="xml:$xml" "$t") > "$logs/$name.log" 2>&1; then
    passed=$((passed + 1)); status=PASS
  else
    rc=$?; failed=$((failed + 1)); status="FAIL (exit $rc)"
  fi
  skipped=""
  if [[ -f $xml ]]; then
    # One line per skipped test: "Suite.Name: message".
    skipped=$(python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    skip = case.find("skipped")
    if skip is not None or case.get("result") == "skipped":
        message = (skip.get("message") if skip is not None else "") or ""
        print(f"{case.get('classname')}.{case.get('name')}: {message.splitlines()[0] if message else 'skipped'}")
PY
)
  fi
  count=0
  [[ -n $skipped ]] && count=$(wc -l <<<"$skipped")
  not_run=$((not_run + count))
  if [[ $count -gt 0 ]]; then
    echo "$status $name ($count tests not run)"
    while IFS= read -r line; do not_run_lines+=("  not run: $name $line"); done <<<"$skipped"
  else
    echo "$status $name"
  fi
  [[ $status == PASS ]] || tail -n 30 "$logs/$name.log"
done
for line in "${not_run_lines[@]+"${not_run_lines[@]}"}"; do echo "$line"; done
echo "$passed passed, $failed failed, $not_run tests not run"
[[ $failed == 0 ]]
