#!/usr/bin/env bash
# bazel run //install -- --prefix=PREFIX: copies lockstep's install tree (install/BUILD) into
# PREFIX. A second install over the first replaces it: the files the earlier one listed in
# PREFIX/lib/cmake/lockstep/install_manifest.txt and the new tree no longer has are removed. The
# new tree is staged under PREFIX first, so a failure (a full disk) leaves the earlier install
# as it was.
set -euo pipefail
tree=$1
shift
prefix=""
for arg in "$@"; do
  case $arg in
    --prefix=*) prefix=${arg#--prefix=} ;;
    *) echo "install: unknown argument '$arg' (usage: bazel run //install -- --prefix=PREFIX)" >&2; exit 2 ;;
  esac
done
[[ -n $prefix ]] || { echo "install: --prefix=PREFIX is required" >&2; exit 2; }
[[ $prefix == /* ]] || { echo "install: --prefix '$prefix' must be an absolute path" >&2; exit 2; }
[[ -d $tree ]] || { echo "install: the install tree '$tree' is missing" >&2; exit 1; }
mkdir -p "$prefix"
manifest=$prefix/lib/cmake/lockstep/install_manifest.txt
stage=$(mktemp -d "$prefix/.lockstep-install.XXXXXX")
files=$stage.files
trap 'rm -rf "$stage" "$files"' EXIT
cp -R "$tree/." "$stage/"
(cd "$stage" && find . -type f | sed 's|^\./||' | sort) > "$files"
if [[ -f $manifest ]]; then
  comm -23 <(sort "$manifest") "$files" | while IFS= read -r old; do
    rm -f "$prefix/$old"
    rmdir -p --ignore-fail-on-non-empty "$(dirname "$prefix/$old")" 2>/dev/null || true
  done
fi
while IFS= read -r f; do
  mkdir -p "$(dirname "$prefix/$f")"
  mv -f "$stage/$f" "$prefix/$f"
done < "$files"
mkdir -p "$(dirname "$manifest")"
mv -f "$files" "$manifest"
echo "install: lockstep $(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' \
  "$prefix/lib/cmake/lockstep/lockstepConfigVersion.cmake") into $prefix" \
  "($(wc -l < "$manifest") files; find_package(lockstep) with CMAKE_PREFIX_PATH=$prefix)"
