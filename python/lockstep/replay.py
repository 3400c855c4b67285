"""A rank's complete state at a step boundary, captured for the state-replay protocol
(replay/state_capture.h in the C++ library): ``tools/replay`` runs a program through an
uninterrupted reference, an independent run, a resumed run and deliberately broken resumes, and
compares every rank's captures byte for byte, naming the first differing step, rank, state path,
byte and element. A Python program is replayed exactly as a C++ one: it takes the protocol's
flags (``--steps``, ``--capture_dir``, ``--save_every``, ``--save_dir``, ``--resume``,
``--resume_omit``) and calls ``capture_state`` after each step's update.

What a capture holds, in this order: the data position, the ledger's step, every RNG stream of
``streams`` (lockstep.rng.RankStreams: the caller's default generators, the model stream, named
streams), Python's ``random`` and NumPy's global generator (``python_random=True``,
``numpy_random=True``), the optimizer's state, every parameter and buffer, every gradient. A part
the program does not have is declared in ``absent`` with the reason (``absent={"ledger": "no
recovery ledger"}``; for the generators, ``"python_random"``/``"numpy_random"``): a part neither
given nor declared raises ``InvalidArgumentError`` naming it, so nothing is skipped silently.

Example (a training loop under torchrun)::

    optimizer.step()
    if args.capture_dir:
        lockstep.replay.capture_state(args.capture_dir, step + 1, model=model,
                                      optimizer=optimizer, streams=streams,
                                      data_position=step + 1, python_random=True,
                                      absent={"ledger": "this program keeps no ledger",
                                              "numpy_random": "this program does not use NumPy"})
    optimizer.zero_grad()
"""

import os
import random
import struct

import torch

from . import _C
from .numerics import optimizer_entries

_PROGRAM_GENERATORS = ("python_random", "numpy_random")


def _float_bits(value):
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _bits_float(bits):
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def python_random_state():
    """Python's ``random`` module state as an int64 tensor (restore_python_random takes it)."""
    version, words, gauss = random.getstate()
    return torch.tensor([version, *words, gauss is not None,
                         _float_bits(gauss) if gauss is not None else 0], dtype=torch.int64)


def restore_python_random(state):
    """Puts back a state ``python_random_state`` returned."""
    values = [int(v) for v in state.tolist()]
    gauss = _bits_float(values[-1]) if values[-2] else None
    random.setstate((values[0], tuple(values[1:-2]), gauss))


def numpy_random_state():
    """NumPy's global generator state as an int64 tensor (restore_numpy_random takes it)."""
    import numpy  # only a program that uses NumPy asks for its state
    _name, keys, pos, has_gauss, cached = numpy.random.get_state()
    return torch.tensor([*[int(k) for k in keys], pos, has_gauss, _float_bits(cached)],
                        dtype=torch.int64)


def restore_numpy_random(state):
    """Puts back a state ``numpy_random_state`` returned."""
    import numpy
    values = [int(v) for v in state.tolist()]
    numpy.random.set_state(("MT19937", numpy.array(values[:-3], dtype=numpy.uint32), values[-3],
                            values[-2], _bits_float(values[-1])))


def rank_and_world(rank=None, world_size=None):
    """``rank`` and ``world_size``, each defaulting to torch.distributed's (else $RANK and
    $WORLD_SIZE, else 0 and 1)."""
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if initialized else os.environ.get("RANK", "0")
    if world_size is None:
        world_size = (torch.distributed.get_world_size() if initialized
                      else os.environ.get("WORLD_SIZE", "1"))
    return int(rank), int(world_size)


def capture_state(capture_dir, step, *, model=None, weights=None, optimizer=None, streams=None,
                  data_position=None, ledger_step=None, python_random=False, numpy_random=False,
                  absent=None, rank=None, world_size=None):
    """Writes this rank's capture of ``step`` under ``capture_dir`` (``step<k>/rank<r>/``; see the
    module's docstring). ``model`` (its parameters and buffers) or ``weights`` (``(name,
    tensor)`` pairs) is required; ``rank``/``world_size`` default to torch.distributed's (else
    $RANK/$WORLD_SIZE). Raises ``AlreadyExistsError`` for an existing capture (never
    overwritten), ``InvalidArgumentError`` for a part neither given nor declared absent."""
    if (model is None) == (weights is None):
        raise ValueError("capture_state takes model= or weights=, exactly one")
    if optimizer is not None and model is None:
        raise ValueError("optimizer= needs model= (its state is named by the model's parameters)")
    absent = dict(absent or {})
    program_rng_absent = {k: str(absent.pop(k)) for k in _PROGRAM_GENERATORS if k in absent}
    program_rng = []
    for name, wanted, state in (("python_random", python_random, python_random_state),
                                ("numpy_random", numpy_random, numpy_random_state)):
        if wanted:
            program_rng.append((name, state()))
        elif name not in program_rng_absent:
            raise ValueError(f"{name} is neither captured ({name}=True) nor declared absent "
                             f"(absent={{'{name}': 'why this program does not use it'}})")
    named = (list(model.state_dict(keep_vars=True).items()) if model is not None
             else [(str(n), t) for n, t in weights])
    rank, world_size = rank_and_world(rank, world_size)
    _C._capture_state(os.fspath(capture_dir), int(step), rank, world_size, named,
                      optimizer_entries(model, optimizer) if optimizer is not None else [],
                      streams, data_position, ledger_step, program_rng, program_rng_absent,
                      {str(k): str(v) for k, v in absent.items()})
