"""lockstep's tools as console commands of the installed wheel: ``lockstep-qualify``,
``lockstep-replay``, ``lockstep-diverge``, ``lockstep-compare``, ``lockstep-inventory``,
``lockstep-ledger``, ``lockstep-launch`` (the C++ programs in ``lockstep/bin``) and
``lockstep-report`` (the report page's writer).

Each C++ command replaces this Python process with its program (flags and exit status are the
program's), after putting the libraries it loads on its path: lockstep's own beside it in the
wheel, and those of the torch this Python imports (its ``lib`` folder, and CUDA's libraries where
the torch wheel brought them as ``nvidia-*`` packages). torch is found without importing it.

    $ lockstep-qualify --topology=tp2xcp1xdp2 --device=cpu
    $ lockstep-launch --nproc_per_node=2 train.py --steps=10
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path():
    """The folders the tools' shared libraries are in, for LD_LIBRARY_PATH."""
    folders = [os.path.join(_HERE, "_libs")]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        torch_dir = list(spec.submodule_search_locations)[0]
        folders.append(os.path.join(torch_dir, "lib"))
        nvidia = os.path.join(os.path.dirname(torch_dir), "nvidia")
        if os.path.isdir(nvidia):
            for name in sorted(os.listdir(nvidia)):
                lib = os.path.join(nvidia, name, "lib")
                if os.path.isdir(lib):
                    folders.append(lib)
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    return os.pathsep.join(folders + ([previous] if previous else []))


def _run(tool):
    program = os.path.join(_HERE, "bin", tool)
    if not os.path.isfile(program):
        sys.exit(f"lockstep-{tool}: {program} is missing: this lockstep is not an installed "
                 f"wheel (build one with tools/build_wheel.sh)")
    os.environ["LD_LIBRARY_PATH"] = _library_path()
    os.execv(program, [f"lockstep-{tool}"] + sys.argv[1:])


def qualify():
    """``lockstep-qualify``: tools/qualify (see docs/qualify.md)."""
    _run("qualify")


def replay():
    """``lockstep-replay``: tools/replay, a training program's four launches and broken
    resumes (docs/replay-and-recorders.md)."""
    _run("replay")


def diverge():
    """``lockstep-diverge``: tools/diverge, the first divergence between two recordings."""
    _run("diverge")


def compare():
    """``lockstep-compare``: tools/compare, two safetensors files under a tolerance."""
    _run("compare")


def inventory():
    """``lockstep-inventory``: tools/inventory, a state's tensors and digests."""
    _run("inventory")


def ledger():
    """``lockstep-ledger``: tools/ledger, a recovery ledger's entries."""
    _run("ledger")


def launch():
    """``lockstep-launch``: tools/launch, torchrun's flags and environment (the launcher where
    Debian 12's torchrun crashes before user code runs)."""
    _run("launch")


def report():
    """``lockstep-report``: the HTML page of a qualify or verify evidence file."""
    from . import report_page
    sys.exit(report_page.main(["lockstep-report"] + sys.argv[1:]))
