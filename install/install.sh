#!/usr/bin/env bash
# bazel run //install -- --prefix=PREFIX: copies lockstep's install tree (install/BUILD) into
# PREFIX. A second install over the first replaces it: the files the earlier one listed in
# PREFIX/lib/cmake/lockstep/install_manifest.txt and the new tree no longer has are removed. The
# new tree is staged under PREFIX first and every destination is checked before anything is
# replaced or removed, so a failure (a full disk, a library path that became a folder) leaves the
# earlier install as it was.
#
# The manifest lists each installed file as sha256sum prints it ("HASH  PATH"). Only files the
# earlier install wrote are ever removed: a line is acted on only when its path lies under PREFIX
# (relative, no "..", its folder not a link leading out) and the file there still has the
# recorded hash. Anything else is kept, with a warning: a manifest is a file anyone with write
# access to PREFIX may have edited.
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
real_prefix=$(realpath -e "$prefix")
manifest=$prefix/lib/cmake/lockstep/install_manifest.txt
stage=$(mktemp -d "$prefix/.lockstep-install.XXXXXX")
files=$stage.files
trap 'rm -rf "$stage" "$files" "$files.paths"' EXIT
cp -R "$tree/." "$stage/"
(cd "$stage" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -r -d '\n' sha256sum --) > "$files"
cut -c67- "$files" > "$files.paths"

# Every destination must take a file: one that became a folder stops the install before it
# changes anything.
while IFS= read -r f; do
  if [[ -d $prefix/$f && ! -L $prefix/$f ]]; then
    echo "install: $prefix/$f is a folder where the install puts a file; nothing was changed" >&2
    exit 1
  fi
done < "$files.paths"

# Whether the manifest line's PATH may be removed (see the top of this file).
removable() {  # HASH PATH
  local hash=$1 rel=$2 folder
  [[ -n $rel && $rel != /* && /$rel/ != */../* && /$rel/ != */./* ]] || return 1
  [[ -f $prefix/$rel && ! -L $prefix/$rel ]] || return 1
  folder=$(realpath -e "$(dirname "$prefix/$rel")") || return 1
  [[ $folder == "$real_prefix" || $folder == "$real_prefix"/* ]] || return 1
  [[ $(sha256sum -- "$prefix/$rel" | cut -c1-64) == "$hash" ]]
}

if [[ -f $manifest && ! -L $manifest ]]; then
  while IFS= read -r line; do
    hash=${line:0:64} rel=${line:66}
    # A line without a hash (an install before hashes were recorded) names its path whole.
    [[ $hash =~ ^[0-9a-f]{64}$ && ${line:64:2} == "  " ]] || { hash="" rel=$line; }
    grep -qxF -- "$rel" "$files.paths" && continue  # replaced below
    if [[ -n $hash ]] && removable "$hash" "$rel"; then
      rm -f -- "$prefix/$rel"
      rmdir -p --ignore-fail-on-non-empty "$(dirname "$prefix/$rel")" 2>/dev/null || true
    elif [[ -n $line ]]; then
      echo "install: warning: kept '$line' of the earlier manifest: not a file that install wrote under $prefix" >&2
    fi
  done < "$manifest"
fi
while IFS= read -r f; do
  mkdir -p "$(dirname "$prefix/$f")"
  mv -fT -- "$stage/$f" "$prefix/$f"
done < "$files.paths"
mkdir -p "$(dirname "$manifest")"
mv -fT "$files" "$manifest"
echo "install: lockstep $(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' \
  "$prefix/lib/cmake/lockstep/lockstepConfigVersion.cmake") into $prefix" \
  "($(wc -l < "$manifest") files; find_package(lockstep) with CMAKE_PREFIX_PATH=$prefix)"
