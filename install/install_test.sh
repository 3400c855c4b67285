#!/usr/bin/env bash
# install.sh on a small tree of its own (no Bazel build needed): a reinstall removes only files
# the earlier install wrote under the prefix, whatever its manifest says, and a destination that
# became a folder stops the install before anything changes.
set -euo pipefail
install=$(realpath "${INSTALL_SH:-install/install.sh}")
tmp=${TEST_TMPDIR:-$(mktemp -d)}
rm -rf "$tmp/t"
mkdir -p "$tmp/t"
cd "$tmp/t"
fail() { echo "FAIL: $*"; exit 1; }

make_tree() {  # DIR VERSION: a tree shaped like lockstep's
  mkdir -p "$1/lib/cmake/lockstep" "$1/include/planner"
  echo "set(PACKAGE_VERSION \"$2\")" >"$1/lib/cmake/lockstep/lockstepConfigVersion.cmake"
  echo "library $2" >"$1/lib/liblockstep_planner.so"
  echo "// header $2" >"$1/include/planner/plan.h"
}
make_tree one 0.1.0
make_tree two 0.2.0
echo "// only in the first" >one/include/planner/old.h
prefix=$PWD/prefix
manifest=$prefix/lib/cmake/lockstep/install_manifest.txt
bash "$install" one --prefix="$prefix" >/dev/null
[[ $(wc -l <"$manifest") == 4 ]] || fail "the manifest does not list the 4 files: $(cat "$manifest")"
grep -qE '^[0-9a-f]{64}  include/planner/old\.h$' "$manifest" || fail "no hash line for old.h"

# A hostile manifest: files outside the prefix (by "..", by an absolute path, by a folder that is
# a link leading out), with their true hashes; a file someone changed since the install.
mkdir -p outside
echo "victim" >outside/victim
victim_hash=$(sha256sum outside/victim | cut -c1-64)
ln -s "$PWD/outside" "$prefix/include/leads_out"
{
  echo "$victim_hash  ../outside/victim"
  echo "$victim_hash  $PWD/outside/victim"
  echo "$victim_hash  include/leads_out/victim"
} >>"$manifest"
echo "// edited by its user" >>"$prefix/include/planner/old.h"
bash "$install" two --prefix="$prefix" >/dev/null 2>"$tmp/t/warnings.txt"
[[ -f outside/victim ]] || fail "a reinstall removed a file outside the prefix"
[[ -f $prefix/include/planner/old.h ]] || fail "a file changed since the install was removed"
grep -q "kept" "$tmp/t/warnings.txt" || fail "no warning for the lines it kept"
[[ $(cat "$prefix/include/planner/plan.h") == "// header 0.2.0" ]] || fail "plan.h not replaced"

# A file the earlier install wrote, unchanged, and gone from the new tree: removed.
bash "$install" one --prefix="$prefix" >/dev/null 2>&1
rm "$prefix/include/planner/old.h"
bash "$install" one --prefix="$prefix" >/dev/null 2>&1
bash "$install" two --prefix="$prefix" >/dev/null 2>&1
[[ ! -e $prefix/include/planner/old.h ]] || fail "a stale file of the earlier install was kept"

# A library path that became a folder: refused, non-zero, nothing changed.
rm "$prefix/lib/liblockstep_planner.so"
mkdir "$prefix/lib/liblockstep_planner.so"
set +e
bash "$install" one --prefix="$prefix" >/dev/null 2>"$tmp/t/folder.txt"
rc=$?
set -e
[[ $rc != 0 ]] || fail "an install over a library path that became a folder exited 0"
grep -q "is a folder" "$tmp/t/folder.txt" || fail "the refusal does not name the folder: $(cat "$tmp/t/folder.txt")"
[[ $(cat "$prefix/include/planner/plan.h") == "// header 0.2.0" ]] || fail "the refused install changed plan.h"
[[ -z $(find "$prefix" -maxdepth 1 -name '.lockstep-install*') ]] || fail "a staging folder was left"
echo "install test: ok"
