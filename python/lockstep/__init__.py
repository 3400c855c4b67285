"""lockstep from Python: a thin binding over lockstep's C++ libraries.

Import torch first (or let this do it): the extension takes torch's own tensors, devices and
torch.distributed process groups.

    import lockstep
    streams = lockstep.rng.RankStreams()
    with lockstep.rng.model_stream(streams):
        out = model(x)                      # dropout draws from the model stream
    lockstep.rng.synchronize(tp_cp_group, streams)  # the caller's draws agree again
"""

import torch  # noqa: F401  (loads LibTorch and registers its pybind11 types)
import torch.distributed  # noqa: F401  (registers ProcessGroup for the bindings)

from . import errors
from . import _C
from . import checkpoint
from . import distributed
from . import numerics
from . import planner
from . import rng
from . import trainer

__all__ = ["checkpoint", "distributed", "errors", "numerics", "planner", "rng", "trainer"]
