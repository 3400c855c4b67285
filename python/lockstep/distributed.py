"""lockstep's view of the caller's torch.distributed groups.

Every lockstep call that takes a group takes the ProcessGroup the program made with
torch.distributed (``init_process_group``, ``new_group``), or None for "no group" — never an
implicit WORLD. The first use of a group adopts it as a lockstep Communicator; later uses reuse
that communicator, whose collectives keep their in-step check (members calling different
collectives get an error naming each member's call, never a hang or a crash). Gloo groups take
CPU and CUDA tensors; NCCL groups (torch >= 2.0) take CUDA tensors on the rank's current device
(``torch.cuda.set_device``), and lockstep's CPU tensors are copied there and back.

Adopting a group is collective over its members (every lockstep call that takes a group is): they
meet in torch.distributed's default store and, when they share this host, connect a host lane, so
that small CPU tensors (an RNG hand-back's states, votes, digests) move through shared memory in
microseconds rather than through Gloo's sockets. Each group's lane is keyed by the group's name and
how many times this process has adopted it, which every member counts alike as long as the members
adopt and release the group together (lockstep's calls release it on an error, which every member
sees). ``LOCKSTEP_HOST_LANE=0`` in the environment (the same on every rank) turns the lane off:
everything then moves through the group.
"""

import datetime
import os

import torch.distributed as dist

from . import _C

DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)

_adopted = {}  # id(group) -> (group, Communicator): the group is kept so its id stays unique
_adoptions = {}  # group name -> how many times this process has adopted the group


def global_ranks(group):
    """The global ranks of ``group``'s members, in group-rank order."""
    get = getattr(dist, "get_process_group_ranks", None)
    if get is not None:
        return list(get(group))
    members = dist.distributed_c10d._pg_group_ranks[group]  # LibTorch 1.13: global -> group
    return [g for g, _ in sorted(members.items(), key=lambda item: item[1])]


def communicator(group, timeout=DEFAULT_TIMEOUT):
    """The lockstep Communicator of a torch.distributed group (adopted once, then reused).

    ``timeout`` bounds each of its collectives (a ``datetime.timedelta`` or seconds). After
    an error a communicator is unusable: lockstep's calls ``release`` it, so the next call adopts
    the group afresh.
    """
    if group is None:
        raise ValueError("group is None: pass the torch.distributed group (None means no group)")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group (new_group returned "
                         "NON_GROUP_MEMBER here)")
    if not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized (call init_process_group first)")
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    held = _adopted.get(id(group))
    if held is not None and held[0] is group and held[1].timeout_seconds == seconds:
        return held[1]
    name = _group_name(group)
    count = _adoptions.get(name, 0)
    _adoptions[name] = count + 1
    lane = os.environ.get("LOCKSTEP_HOST_LANE", "1") != "0"
    comm = _C._adopt_group(group, global_ranks(group), dist.get_world_size(), seconds,
                           store=dist.distributed_c10d._get_default_store() if lane else None,
                           lane_key=f"adopted/{name}/{count}",
                           cuda_device=_staging_device(group))
    _adopted[id(group)] = (group, comm)
    return comm


def _staging_device(group):
    """This rank's CUDA device for a group without a Gloo backend (NCCL's: lockstep's CPU tensors
    are staged there), else -1. Only such groups touch CUDA here: a forked child of a process
    that used CUDA cannot."""
    if "gloo" in str(dist.get_backend(group)):
        return -1
    import torch
    return torch.cuda.current_device() if torch.cuda.is_available() else -1


def _group_name(group):
    """torch.distributed's name of ``group``: the same on every member (groups are named in the
    order every rank creates them)."""
    name = getattr(group, "group_name", None)  # LibTorch 2.x
    if name is None:
        name = dist.distributed_c10d._pg_names[group]  # LibTorch 1.13
    return name


def has_host_lane(group, timeout=DEFAULT_TIMEOUT):
    """Whether ``group``'s small CPU tensors move through shared memory (its members share this
    host). Adopts the group if it is not yet: collective, like every call that takes a group."""
    return _C._has_host_lane(communicator(group, timeout))


def release(group):
    """Forgets ``group``'s communicator (after an error, or before destroying the group)."""
    _adopted.pop(id(group), None)


def run(group, call, timeout=DEFAULT_TIMEOUT):
    """``call(communicator)`` for ``group`` (None stays None); an error releases the group's
    communicator before it propagates."""
    if group is None:
        return call(None)
    comm = communicator(group, timeout)
    try:
        return call(comm)
    except Exception:
        release(group)
        raise


class Topology:
    """The DP x TP x CP layout of a world, as lockstep numbers it (global rank = dp * (cp * tp) +
    cp * tp + tp_rank): ``coordinates(rank)`` is (dp, tp, cp); ``tp_cp_group(rank)``,
    ``tp_group``, ``cp_group`` and ``dp_group`` a rank's groups (global ranks); ``groups(kind)``
    every group of a kind ("tp_cp", "tp", "cp", "dp"), in the order every rank must create them
    with torch.distributed.new_group."""

    def __init__(self, world_size, tp, cp):
        self._topology = _C.Topology(world_size, tp, cp)
        self.world_size, self.dp_size = world_size, self._topology.dp_size

    def coordinates(self, rank):
        return self._topology.coordinates(rank)

    def tp_cp_group(self, rank):
        return self._topology.tp_cp_group(rank)

    def tp_group(self, rank):
        return self._topology.tp_group(rank)

    def cp_group(self, rank):
        return self._topology.cp_group(rank)

    def dp_group(self, rank):
        return self._topology.dp_group(rank)

    def groups(self, kind):
        of = {"tp_cp": self.tp_cp_group, "tp": self.tp_group, "cp": self.cp_group,
              "dp": self.dp_group}[kind]
        seen = []
        for rank in range(self.world_size):
            if of(rank) not in seen:
                seen.append(of(rank))
        return seen


def topology(world_size, tp, cp):
    """The layout of ``world_size`` ranks with TP size ``tp`` and CP size ``cp`` (ValueError when
    they do not divide it)."""
    return Topology(world_size, tp, cp)


# The differentiable collectives (collectives/differentiable.h) over a torch.distributed group,
# for TP/CP layers written in Python. ``group=None``: a group of one (the identity).

def copy_to_group(x, group):
    """``x`` unchanged; its gradient summed over ``group`` in backward (before a column-parallel
    layer)."""
    return run(group, lambda comm: _C._copy_to_group(x, comm))


def reduce_from_group(x, group):
    """The sum of ``x`` over ``group``; the gradient passed through in backward (after a
    row-parallel layer)."""
    return run(group, lambda comm: _C._reduce_from_group(x, comm))


def gather_rows(x, widest, group):
    """[group size x widest, ...]: member r's rows of ``x`` (n_r <= widest) at rows
    [r * widest, r * widest + n_r), zeros after; the gradient of each member's rows goes back to
    it (keys and values of a CP shard)."""
    return run(group, lambda comm: _C._gather_rows(x, widest, comm))


def reduce_scatter_rows(x, rows, widest, group):
    """This member's ``rows`` rows of the sum over ``group`` of ``x`` (laid out as gather_rows
    lays it out)."""
    return run(group, lambda comm: _C._reduce_scatter_rows(x, rows, widest, comm))


def all_gather(x, group):
    """Every member's ``x`` (same shape and dtype), by group rank (not differentiable)."""
    if group is None:
        return [x]
    return run(group, lambda comm: _C._all_gather(comm, x))


def all_reduce_sum(x, group):
    """``x`` replaced by its sum over ``group``, in place (not differentiable)."""
    if group is not None:
        run(group, lambda comm: _C._all_reduce_sum(comm, x))
    return x
