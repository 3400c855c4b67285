"""Writes lockstep/_build.py: what the package was built against (lockstep's version, the
Python, LibTorch's release and C++ ABI, CUDA or not), from the build facts the @libtorch and
@python repositories record. lockstep/__init__.py checks it before the extension loads.

    python3 build_info.py VERSION LIBTORCH_FACTS PYTHON_FACTS > _build.py
"""
import sys


def facts(path):
    """The key=value lines of a build_facts.txt file."""
    with open(path, encoding="utf-8") as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    with open(argv[1], encoding="utf-8") as f:
        version = f.read().strip()
    torch, python = facts(argv[2]), facts(argv[3])
    if not torch.get("torch_release"):
        sys.exit(f"{argv[2]}: LibTorch's headers declare no release (torch/version.h)")
    print('"""What this lockstep was built against (written by python/wheel/build_info.py)."""')
    print(f"VERSION = {version!r}")
    print(f"PYTHON = {python['python_version']!r}")
    print(f"TORCH_RELEASE = {torch['torch_release']!r}")
    print(f"CXX11_ABI = {torch['cxx11_abi'] == '1'!r}")
    print(f"CUDA = {torch['cuda'] == '1'!r}")


if __name__ == "__main__":
    main(sys.argv)
