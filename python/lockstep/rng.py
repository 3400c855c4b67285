"""A rank's RNG streams, kept in step across tensor/context-parallel replicas.

The contract (rng/rank_streams.h, rng/synchronize.h in the C++ library):

- ``RankStreams(cuda_device=-1)`` owns the rank's default generators (CPU, and the CUDA device's
  when given), its model stream and its named streams. Create one per process.
- ``with model_stream(streams):`` runs the block on the model stream: the caller's CPU/CUDA
  generator states are put aside on entry and restored on exit, also when the block raises.
  Nested scopes share the stream, and each scope continues where the last one stopped. The
  first scope derives the stream from the caller's state at that moment: open it first where
  the replicas' states agree (right after ``synchronize``), and every replica that runs the same
  model work draws the same.
- ``synchronize(group, streams)`` makes the caller's generator states of ``group``'s members
  equal to its leader's (group rank 0): call it after work that drew differently on each member
  (sampling on the leader), before the members draw again. ``group=None``: nothing to do.
- ``capture_resume_state`` / ``restore_resume_state``: every stream as bytes, for an exact
  resume; corrupt bytes or bytes of other generators raise and change nothing.
- ``partitioned_uniform`` / ``partitioned_dropout``: draws that depend on a value's global
  position only, so any TP/CP split of a tensor gets the same numbers.
"""

import torch

from . import _C
from . import distributed

RankStreams = _C.RankStreams
capture_resume_state = _C.capture_resume_state
restore_resume_state = _C.restore_resume_state


# ``with model_stream(streams):`` runs the block on the model stream, and ``with
# named_stream(streams, name):`` on the named stream ``name`` (added with
# ``streams.add_named_stream``); the caller's state is back afterwards, also when the block raises.
# Both are context managers written in C++ (a scope costs two calls into the binding).
model_stream = _C.model_stream
named_stream = _C.named_stream


def synchronize(group, streams, timeout=distributed.DEFAULT_TIMEOUT):
    """Gives every member of ``group`` its leader's caller state (see the module's contract).

    ``group``: a torch.distributed ProcessGroup this rank is a member of, or None (no group:
    returns at once). Collective over the group; the leader is group rank 0.
    """
    distributed.run(group, lambda comm: _C._synchronize(comm, streams), timeout)


def _box(box):
    return [(int(begin), int(end)) for begin, end in box]


def partitioned_uniform(seed, stream, step, global_shape, box, device="cpu"):
    """Uniform [0, 1) float32 values of ``box`` (a (begin, end) per dimension) of a global tensor
    of ``global_shape``, keyed by (seed, stream, step)."""
    return _C.partitioned_uniform(seed, stream, step, list(global_shape), _box(box),
                                  torch.device(device))


def partitioned_dropout_mask(seed, stream, step, global_shape, box, p, device="cpu"):
    """The keep-mask (bool) of ``box``: True where dropout with probability ``p`` keeps."""
    return _C.partitioned_dropout_mask(seed, stream, step, list(global_shape), _box(box), p,
                                       torch.device(device))


class _PartitionedDropout(torch.autograd.Function):
    """Dropout whose backward is the same dropout of the gradient: the mask is drawn again from
    its key (it depends on the element's global position only), so nothing is saved for it."""

    @staticmethod
    def forward(ctx, shard, seed, stream, step, global_shape, box, p):
        ctx.key = (seed, stream, step, global_shape, box, p)
        return _C.partitioned_dropout(shard, seed, stream, step, global_shape, box, p)

    @staticmethod
    def backward(ctx, grad):
        return (_PartitionedDropout.apply(grad.contiguous(), *ctx.key),) + (None,) * 6


def partitioned_dropout(shard, seed, stream, step, global_shape, box, p):
    """Dropout of ``shard``, the ``box`` of a global tensor: kept values scaled by 1 / (1 - p).

    Differentiable: the gradient flows through the kept elements, scaled alike, and the mask is
    drawn again in the backward pass instead of being kept.

    Example::

        x = torch.randn(4, 8, requires_grad=True)  # rows 4:8 of a [8, 8] activation
        y = lockstep.rng.partitioned_dropout(x, seed=7, stream=0, step=3, global_shape=[8, 8],
                                             box=[(4, 8), (0, 8)], p=0.1)
        y.sum().backward()  # x.grad: 1 / 0.9 where kept, 0 where dropped
    """
    return _PartitionedDropout.apply(shard, seed, stream, step, list(global_shape), _box(box), p)