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

import torch  # noqa: F401  (loads LibTorch and registers its pybind11 types)
import torch.distributed  # noqa: F401  (registers ProcessGroup for the bindings)

from . import errors
from . import _C
from . import checkpoint
from . import controls
from . import determinism
from . import distributed
from . import numerics
from . import planner
from . import recording
from . import replay
from . import rng
from . import trainer
from . import variability

__all__ = ["checkpoint", "controls", "determinism", "distributed", "errors", "numerics",
           "planner", "recording", "replay", "rng", "trainer", "variability", "verify"]
