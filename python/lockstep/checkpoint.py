"""Activation checkpointing whose recompute replays the forward's randomness exactly.

``checkpoint(function, *args)`` has torch.utils.checkpoint.checkpoint's call shape: ``function``
runs without keeping activations; backward recomputes it with the RNG streams rewound to their
values at forward (so dropout masks are the forward's), then restores the live streams — the
caller's draws between forward and backward, and an open model-stream scope, are left as they
were. Nothing is retained once backward has run (see ``retained_state``). The C++ library does
the work (checkpoint/checkpoint.h); this wraps the call.
"""

import torch

from . import _C


def checkpoint(function, *args, streams=None, named_streams=(), use_reentrant=None,
               preserve_rng_state=True, **kwargs):
    """Runs ``function(*args, **kwargs)`` as a checkpointed block; returns what it returns (a
    tensor, or a tuple of tensors).

    ``streams``: a ``lockstep.rng.RankStreams`` whose named streams are replayed too (all of
    them, or those in ``named_streams``); None replays the default CPU generator and the CUDA
    generator of the inputs' device. ``use_reentrant`` is accepted for torch.utils.checkpoint's
    signature (the C++ checkpoint is one autograd node, like the reentrant form);
    ``preserve_rng_state=False`` is refused: replaying the randomness is the point.
    """
    if not preserve_rng_state:
        raise ValueError("preserve_rng_state=False: lockstep's checkpoint always replays the "
                         "forward's randomness")
    del use_reentrant
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    single = []

    def block(inputs):
        call = list(args)
        for i, tensor in zip(positions, inputs):
            call[i] = tensor
        out = function(*call, **kwargs)
        if isinstance(out, torch.Tensor):
            single.append(True)
            return [out]
        if not isinstance(out, (tuple, list)) or \
                not all(isinstance(t, torch.Tensor) for t in out):
            raise TypeError("a checkpointed function returns a tensor or a tuple of tensors, "
                            f"not {type(out).__name__}")
        return list(out)

    outputs = _C._checkpoint(block, [args[i] for i in positions], streams, list(named_streams))
    return outputs[0] if single else tuple(outputs)


def retained_state():
    """What checkpoints hold for a backward still to come: {"nodes", "rng_bytes"}."""
    return _C.retained_checkpoint_state()
