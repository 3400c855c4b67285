"""lockstep's view of the caller's torch.distributed groups.

Every lockstep call that takes a group takes the ProcessGroup the program made with
torch.distributed (``init_process_group``, ``new_group``), or None for "no group" — never an
implicit WORLD. The first use of a group adopts it as a lockstep Communicator (no collective runs
to adopt it); later uses reuse that communicator, whose collectives keep their in-step check
(members calling different collectives get an error naming each member's call, never a hang or
a crash). Gloo groups only, with CPU and CUDA tensors.
"""

import datetime

import torch.distributed as dist

from . import _C

DEFAULT_TIMEOUT = datetime.timedelta(seconds=60)

_adopted = {}  # id(group) -> (group, Communicator): the group is kept so its id stays unique


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
    comm = _C._adopt_group(group, global_ranks(group), dist.get_world_size(), seconds)
    _adopted[id(group)] = (group, comm)
    return comm


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
