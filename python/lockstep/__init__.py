"""lockstep from Python: a thin binding over lockstep's C++ libraries.

Import torch first (or let this do it): the extension takes torch's own tensors, devices and
torch.distributed process groups.

    import lockstep
    streams = lockstep.rng.RankStreams()
    with lockstep.rng.model_stream(streams):
        out = model(x)                      # dropout draws from the model stream
    lockstep.rng.synchronize(tp_cp_group, streams)  # the caller's draws agree again

The proofs for a whole program: lockstep.determinism (deterministic mode, the execution context),
lockstep.replay (state captures for tools/replay), lockstep.recording (module and operator
recorders), lockstep.variability (repeatability, matched actors) and ``python3 -m
lockstep.verify`` (both checks over a program, with qualify's evidence and page).
"""

import re as _re
import sys as _sys

import torch  # noqa: F401  (loads LibTorch and registers its pybind11 types)
import torch.distributed  # noqa: F401  (registers ProcessGroup for the bindings)

from . import _build


def _check_torch():
    """The extension is C++ over LibTorch, whose ABI changes between releases: refuse a torch
    other than the one it was built against here, naming both, before a symbol error could."""
    found = _re.match(r"\d+\.\d+\.\d+", torch.__version__)
    release = found.group(0) if found else torch.__version__
    abi = torch.compiled_with_cxx11_abi()
    if release != _build.TORCH_RELEASE or abi != _build.CXX11_ABI:
        raise ImportError(
            f"lockstep {_build.VERSION} was built against torch {_build.TORCH_RELEASE} "
            f"(C++11 ABI {_build.CXX11_ABI}), but this Python has torch {torch.__version__} "
            f"(C++11 ABI {abi}) from {torch.__file__}: build lockstep for this torch "
            f"(tools/build_wheel.sh --python={_sys.executable})")


_check_torch()

from . import errors  # noqa: E402  (after the check: it loads the extension)
from . import _C  # noqa: E402
from . import checkpoint  # noqa: E402
from . import controls
from . import determinism
from . import distributed
from . import invariant
from . import numerics
from . import planner
from . import recording
from . import replay
from . import rng
from . import trainer
from . import variability

__all__ = ["checkpoint", "controls", "determinism", "distributed", "errors", "invariant",
           "numerics", "planner", "recording", "replay", "rng", "trainer", "variability", "verify"]
