"""The ELF facts a wheel's checks and its assembly need, read with binutils' readelf (as
Debian's binutils ships it): a file's needed libraries, its run paths, and the newest glibc
symbol version it needs."""

import re
import subprocess

# Libraries a wheel must not carry: the C and C++ runtimes (the platform's, as manylinux
# defines them), and those of torch and of the CUDA wheels torch brings (nvidia-*), which must be
# the very copies torch loaded.
PROVIDED = re.compile(
    r"^(ld-linux.*|linux-vdso.*|libc\.so.*|libm\.so.*|libmvec\.so.*|libpthread\.so.*|"
    r"libdl\.so.*|librt\.so.*|libutil\.so.*|libstdc\+\+\.so.*|libgcc_s\.so.*|libgomp\.so.*|"
    r"libtorch.*|libc10.*|libshm\.so.*|libcuda\.so.*|libcudart\.so.*|libcublas.*|libcudnn.*|"
    r"libcufft.*|libcurand.*|libcusparse.*|libcusolver.*|libnccl\.so.*|libnvrtc.*|"
    r"libnvJitLink.*|libcupti.*|libnvshmem.*|libcufile.*|libnvToolsExt.*|libpython.*)$")


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def needed(path):
    """The DT_NEEDED sonames of the ELF file at ``path``."""
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf("-d", path))


def run_paths(path):
    """Its DT_RUNPATH and DT_RPATH entries, in order."""
    found = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]*)\]",
                       _readelf("-d", path))
    return [entry for value in found for entry in value.split(":") if entry]


def glibc_needed(path):
    """The newest GLIBC_2.N version its symbols need, as (2, N); (2, 0) if none."""
    versions = [(2, int(m)) for m in re.findall(r"\bGLIBC_2\.(\d+)", _readelf("-V", path))]
    return max(versions, default=(2, 0))
