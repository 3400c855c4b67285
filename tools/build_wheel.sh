#!/usr/bin/env bash
# Builds lockstep's wheel for a Python and the torch it imports, and prints its path:
#   tools/build_wheel.sh                         Debian's python3 and python3-torch (setup.sh)
#   tools/build_wheel.sh --python=/path/to/python   that interpreter's torch (a pip-installed
#                                                torch ships LibTorch's headers and libraries)
#   tools/build_wheel.sh --libtorch=DIR --python_include=DIR [--cuda]
#                                                a LibTorch tree and Python headers given
#                                                directly (the GPU machine's, built here)
#   [--out=DIR]  where the wheel goes (default: dist/)
# then: pip install dist/lockstep-*.whl   (into the environment that has that torch)
# The build is Bazel's (-c opt), so a second run with the same torch is quick; another torch
# rebuilds what depends on it. A CUDA torch gets --config=cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3 libtorch="" include="" cuda="" out=dist
for arg in "$@"; do
  case $arg in
    --python=*) python=${arg#*=} ;;
    --libtorch=*) libtorch=${arg#*=} ;;
    --python_include=*) include=${arg#*=} ;;
    --cuda) cuda=1 ;;
    --out=*) out=${arg#*=} ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument '$arg' (--help lists them)" >&2; exit 2 ;;
  esac
done
if [[ -n $libtorch || -n $include ]]; then
  [[ -n $libtorch && -n $include ]] || {
    echo "build_wheel.sh: --libtorch and --python_include go together" >&2; exit 2; }
else
  command -v "$python" >/dev/null || { echo "build_wheel.sh: no Python at '$python'" >&2; exit 2; }
  # The interpreter's torch, its headers and CUDA, found by importing it once.
  read -r torch_dir include torch_cuda < <("$python" - <<'PY'
import os, sysconfig
try:
    import torch
except ImportError as e:
    raise SystemExit(f"build_wheel.sh: this Python has no torch ({e}): install torch first")
print(os.path.dirname(torch.__file__), sysconfig.get_paths()["include"],
      1 if torch.version.cuda else 0)
PY
)
  [[ -f $include/Python.h ]] || {
    echo "build_wheel.sh: $include has no Python.h (Debian: apt install python3-dev)" >&2; exit 2; }
  # Debian's torch keeps LibTorch under /usr (the build's default); a pip torch ships its own.
  if [[ -d $torch_dir/include/torch && -d $torch_dir/lib ]]; then libtorch=$torch_dir; fi
  [[ $torch_cuda == 1 ]] && cuda=1
fi
flags=(-c opt)
[[ -n $libtorch ]] && flags+=(--repo_env=LIBTORCH="$libtorch")
[[ -n $include ]] && flags+=(--repo_env=PYTHON_INCLUDE="$include")
[[ -n $cuda ]] && flags+=(--config=cuda)
bazel build "${flags[@]}" //python/wheel:wheel
name=$(cat bazel-bin/python/wheel/wheel_name.txt)
mkdir -p "$out"
rm -f "$out/$name"
cp bazel-bin/python/wheel/lockstep.whl "$out/$name"
chmod u+w "$out/$name"
echo "$out/$name"
