#!/usr/bin/env bash
# Formats every C++ file of the repository with clang-format (.clang-format at the root).
#   tools/format.sh          rewrite files in place
#   tools/format.sh --check  list unformatted files and exit 1 if there are any
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
[[ ${#files[@]} -gt 0 ]] || exit 0
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    printf 'not formatted (run tools/format.sh): %s\n' "${bad[@]}"
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
fi
