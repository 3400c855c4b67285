#!/usr/bin/env bash
# make_tree.sh SPEC TREE VERSION_FILE: lays out lockstep's install tree (install/BUILD) in TREE
# from SPEC's lines "source<TAB>destination<TAB>kind". kind "library": a module's shared library,
# whose run-time search path becomes $ORIGIN (the other modules sit beside it; Bazel's own names
# its build tree); "version": the CMake version file, @VERSION@ replaced; "file": copied as is.
set -euo pipefail
spec=$1 tree=$2
version=$(tr -d ' \n' < "$3")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "make_tree: version '$version' is not X.Y.Z" >&2; exit 1; }
while IFS=$'\t' read -r source destination kind; do
  [[ -n $source ]] || continue
  mkdir -p "$tree/$(dirname "$destination")"
  case $kind in
    library)
      cp "$source" "$tree/$destination"
      chmod u+w "$tree/$destination"
      patchelf --set-rpath '$ORIGIN' "$tree/$destination"
      chmod 0755 "$tree/$destination" ;;
    version) sed "s/@VERSION@/$version/g" "$source" > "$tree/$destination" ;;
    file) cp "$source" "$tree/$destination"; chmod 0644 "$tree/$destination" ;;
    *) echo "make_tree: unknown kind '$kind' for $source" >&2; exit 1 ;;
  esac
done < "$spec"
# Every installed header's includes of lockstep's own headers are installed too: a consumer
# compiling against the tree must never meet a header the tree lacks.
packages='admission|base|checkpoint|collectives|invariant|launch|numerics|planner|qualification|replay|rng|trainer'
missing=0
while IFS= read -r header; do
  while IFS= read -r included; do
    if [[ ! -f $tree/include/$included ]]; then
      echo "make_tree: ${header#"$tree/"} includes $included, which is not installed" >&2
      missing=1
    fi
  done < <(sed -nE "s@^#include \"(($packages)/[^\"]+)\".*@\1@p" "$header")
done < <(find "$tree/include" -name '*.h')
exit $missing
