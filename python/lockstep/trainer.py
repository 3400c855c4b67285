"""TrainerRank from Python: the model's forward on this rank's CP shard of each planned
microbatch, every TP/CP replica handed the full outputs, the RNG contract of trainer_rank.h.

    trainer = TrainerRank(forward, streams, tp_cp_group, tp=1, cp=2, max_tokens=4096)
    for out in trainer.forward_microbatches(rows, lengths):
        loss = (nll(out.outputs, targets[out.input_rows]) * out.loss_weights).sum()
        loss.backward()      # the caller's RNG agrees on every replica here
    # then all-reduce the gradients over CP (and DP), step the optimizer

``forward(work)`` receives a ``ShardWork`` — ``inputs`` (the caller's rows of the shard's
tokens), ``positions``, ``sequence_ids``, ``packed_offsets``, ``microbatch``, ``cp_rank``,
``cp_size``, ``widest_shard``, ``forward_index`` and ``run_block(block, [tensors])`` (a block
through the activation checkpoint when ``activation_checkpointing``) — valid during the call
only, and returns the shard's outputs [n, ...]. It runs inside the model-stream scope: its draws
agree on every replica. An exception in it fails the call on every replica (the others get an
``AbortedError`` naming this rank); on this rank the error raised chains the original exception.
"""

import collections

import torch.distributed as dist

from . import _C
from . import distributed
from . import errors

MicrobatchOutput = collections.namedtuple(
    "MicrobatchOutput", ["microbatch", "outputs", "input_rows", "loss_weights"])
ShardWork = _C.ShardWork


class TrainerRank:
    """A rank's trainer (see the module's docstring). Collective to create: every member of the
    TP x CP group creates its trainer at the same point; the caller's RNG is synchronized and the
    model stream set from it. ``max_tokens``: the microbatch token budget; ``packing`` and
    ``loss_normalization`` as lockstep.planner's; ``activation_checkpointing``: blocks run
    through ``work.run_block`` are recomputed in backward."""

    def __init__(self, forward, streams, tp_cp_group, *, tp=1, cp=1, max_tokens,
                 packing="first_fit_decreasing", loss_normalization="token_mean",
                 activation_checkpointing=False, timeout=distributed.DEFAULT_TIMEOUT):
        self._forward_error = None
        self._group = tp_cp_group

        def adapter(work):
            try:
                return forward(work)
            except BaseException as error:
                self._forward_error = error
                raise

        world_size = dist.get_world_size() if dist.is_initialized() else 1
        world_rank = dist.get_rank() if dist.is_initialized() else 0
        comm = None if tp_cp_group is None else distributed.communicator(tp_cp_group, timeout)
        self._trainer = self._call(lambda: _C._TrainerRank(
            adapter, streams, comm, world_size, world_rank, tp, cp, max_tokens,
            activation_checkpointing, packing, loss_normalization))

    def _call(self, fn):
        self._forward_error = None
        try:
            return fn()
        except Exception as error:
            original, self._forward_error = self._forward_error, None
            if self._group is not None and isinstance(
                    error, (errors.UnavailableError, errors.DeadlineExceededError)):
                distributed.release(self._group)  # a peer is gone: the communicator is spent
            if original is not None and original is not error:
                raise error from original
            raise

    @property
    def cp_rank(self):
        return self._trainer.cp_rank

    @property
    def cp_size(self):
        return self._trainer.cp_size

    def forward_microbatches(self, rows, lengths, ids=None, loss_weights=None):
        """Yields each planned microbatch's ``MicrobatchOutput``; after each, the caller's RNG
        agrees across the group. ``rows``: [sum(lengths), ...], sequence 0's tokens first."""
        stream = self._call(lambda: self._trainer.forward_microbatches(
            rows, list(lengths), ids, loss_weights))
        while True:
            out = self._call(stream.next)
            if out is None:
                return
            yield MicrobatchOutput(*out)

    def forward_all_microbatches(self, rows, lengths, ids=None, loss_weights=None):
        """Every microbatch's ``MicrobatchOutput`` at once; then the caller's RNG agrees."""
        return [MicrobatchOutput(*out) for out in self._call(
            lambda: self._trainer.forward_all_microbatches(rows, list(lengths), ids,
                                                           loss_weights))]

    def register_custom_object(self, name, factory, metadata=""):
        """Registers ``factory()``'s [(name, tensor)] on every replica alike (the leader's values
        broadcast); returns them."""
        return self._call(lambda: self._trainer.register_custom_object(name, metadata, factory))

    def synchronize_caller(self):
        """The caller's RNG made equal across the group (what every hand-back ends with)."""
        self._call(self._trainer.synchronize_caller)

    def save_state(self, path, weights, include_rng_streams=True):
        """Saves ``weights`` (a state_dict, a module or [(name, tensor)]; include optimizer
        state tensors here to save them in the same transaction), the RNG streams and the
        forward counter into ``path``, which must not exist. Complete or absent."""
        self._call(lambda: self._trainer.save_state(str(path), _named(weights),
                                                    include_rng_streams))

    def load_state(self, path, weights):
        """Loads what ``save_state`` wrote into ``weights``' tensors, in place; all or nothing."""
        return self._call(lambda: self._trainer.load_state(str(path), _named(weights)))


def _named(weights):
    import torch
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict(keep_vars=True)
    if isinstance(weights, dict):
        weights = list(weights.items())
    return [(str(k), v.data if hasattr(v, "data") else v) for k, v in weights]
