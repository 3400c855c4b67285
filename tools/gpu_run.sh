#!/usr/bin/env bash
# The GPU bundle's run.sh (tools/gpu_bundle.sh puts it in .gpu-bundle/): runs every test in bin/
# (the *_test executables; the tools and benchmarks there need arguments) or those named on the
# GPU machine, against its LibTorch, CUDA and NCCL, as ../shared/gpu-sdk/run-bundle.sh does.
# Each test binary counts once, as passed, failed or not run, by the not-run convention
# (docs/building.md): a binary that exits 0 having skipped any of its cases (GTEST_SKIP, read from
# its XML: too few GPUs, a CPU-only build's refusals) or having printed a line "NOT RUN: why" is
# not run, never passed, and each skipped case is named with its reason. A named test absent from
# the bundle, or a bundle with no tests, is a failure. Ends with
#   N passed, N failed, N not run
# exiting non-zero on any failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
libs=$here/lib:$site/torch/lib:/usr/local/cuda/lib64
for d in "$site"/nvidia/*/lib; do libs=$libs:$d; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=${OUT:-$here/logs}; mkdir -p "$logs"
passed=0 failed=0 not_run=0
report_lines=()  # "not run: ..." and "failed: ..." lines, printed above the closing line
if [[ $# -gt 0 ]]; then tests=("$@"); else tests=("$here"/bin/*_test); fi
if [[ ! -e ${tests[0]} && $# == 0 ]]; then
  echo "FAIL: no tests in $here/bin (no *_test executable)"
  tests=()
  failed=1
  report_lines+=("failed: the bundle: no *_test executable in bin/")
fi
for t in "${tests[@]}"; do
  [[ -f $t && -x $t ]] || t=$here/bin/$t
  name=$(basename "$t")
  if [[ ! -f $t || ! -x $t ]]; then
    echo "FAIL $name (no such test executable in the bundle: $t)"
    failed=$((failed + 1))
    report_lines+=("failed: $name — not in the bundle")
    continue
  fi
  xml=$logs/$name.xml
  rm -f "$xml"
  if (cd "$(dirname "$t")" && GTEST_OUTPUT="xml:$xml" "$t") > "$logs/$name.log" 2>&1; then
    status=PASS
  else
    rc=$?; status="FAIL (exit $rc)"
  fi
  # Why it did not run its subject, one line each: its "NOT RUN: why" lines, and each skipped
  # case of its XML as "Suite.Name: file:line: message".
  skipped=$(grep -E '^NOT RUN: ' "$logs/$name.log" | sed 's/^NOT RUN: //')
  if [[ -f $xml ]]; then
    skipped+=$'\n'$(python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    skip = case.find("skipped")
    if skip is not None or case.get("result") == "skipped":
        message = (skip.get("message") if skip is not None else "") or "skipped"
        message = ": ".join(line.strip() for line in message.strip().splitlines())
        print(f"{case.get('classname')}.{case.get('name')}: {message}")
PY
)
  fi
  skipped=$(sed '/^$/d' <<<"$skipped")
  count=0
  [[ -n $skipped ]] && count=$(wc -l <<<"$skipped")
  if [[ $status != PASS ]]; then
    failed=$((failed + 1))
    report_lines+=("failed: $name — $status")
  elif [[ $count -gt 0 ]]; then
    status="NOT RUN"
    not_run=$((not_run + 1))
    while IFS= read -r line; do report_lines+=("not run: $name — $line"); done <<<"$skipped"
  else
    passed=$((passed + 1))
  fi
  echo "$status $name"
  [[ $status != FAIL* ]] || tail -n 30 "$logs/$name.log"
done
for line in "${report_lines[@]+"${report_lines[@]}"}"; do echo "$line"; done
echo "$passed passed, $failed failed, $not_run not run"
[[ $failed == 0 ]]
