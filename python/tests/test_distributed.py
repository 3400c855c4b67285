"""lockstep.distributed over torch.distributed groups (Gloo, 127.0.0.1): adoption with and without
the host lane, the collectives' results on both paths, and the GIL rule (Note [GIL] in
python/src/status.h): a blocking call that kept the GIL would deadlock with a Gloo worker freeing
a tensor Python made."""

import os

import pytest
import torch
import torch.distributed as dist

from lockstep import distributed, errors

from distributed_util import run_world

SMALL, LARGE = 16, 40_000  # floats: within the lane's 64 KiB, and past it


def _sums(rank, world_size, lane):
    os.environ["LOCKSTEP_HOST_LANE"] = "1" if lane else "0"
    group = dist.new_group(list(range(world_size)))
    has_lane = distributed.has_host_lane(group)
    results = []
    for n in (SMALL, LARGE):
        x = torch.arange(n, dtype=torch.float32) * (rank + 1)
        distributed.all_reduce_sum(x, group)
        results.append(bool(torch.equal(x, torch.arange(n, dtype=torch.float32) * 3)))
        gathered = distributed.all_gather(torch.full((n,), float(rank)), group)
        results.append([float(g[0]) for g in gathered] == [0.0, 1.0])
    return has_lane, results


@pytest.mark.parametrize("lane", [True, False], ids=["host lane", "Gloo only"])
def test_collectives_give_the_same_results_with_and_without_the_host_lane(lane):
    for has_lane, results in run_world(2, _sums, lane):
        assert has_lane == lane
        assert all(results), results


def _temporaries(rank, world_size, iterations):
    os.environ["LOCKSTEP_HOST_LANE"] = "0"  # every tensor through Gloo's worker threads
    group = dist.new_group([0, 1])
    for i in range(iterations):
        # A temporary: Python lets go of it as soon as the call returns, so a Gloo worker may
        # hold its last reference and need the GIL to free it during the next call.
        distributed.all_reduce_sum(torch.full((LARGE,), float(i)), group)
        distributed.gather_rows(torch.ones(4, 8) * i, 4, group)
    return "ok"


def test_blocking_calls_release_the_gil_so_gloo_workers_can_free_python_tensors():
    assert run_world(2, _temporaries, 300, timeout=100) == ["ok", "ok"]


def _mismatch(rank, world_size, lane):
    os.environ["LOCKSTEP_HOST_LANE"] = "1" if lane else "0"
    group = dist.new_group([0, 1])
    with pytest.raises(errors.LockstepError) as raised:
        distributed.all_gather(torch.zeros(3 + rank), group)
    return raised.value.code, str(raised.value)


# The lane's own check names "different collectives", Gloo's in-step check "out of step": the
# message shows which path ran.
@pytest.mark.parametrize("lane,words", [(True, "called different collectives"),
                                        (False, "out of step")], ids=["host lane", "Gloo only"])
def test_members_that_call_different_collectives_get_an_error_not_a_hang(lane, words):
    results = run_world(2, _mismatch, lane)
    codes = [code for code, _ in results]
    assert "FAILED_PRECONDITION" in codes, results
    assert set(codes) <= {"FAILED_PRECONDITION", "UNAVAILABLE"}, results
    assert any(words in message for code, message in results if code == "FAILED_PRECONDITION")
