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


def _split(rank, world_size):
    import time
    group = dist.new_group([0, 1])
    assert distributed.has_host_lane(group)
    start = time.monotonic()
    # Rank 0's 16 floats fit the host lane; rank 1's 40,000 do not, so it takes Gloo.
    with pytest.raises(errors.LockstepError) as raised:
        distributed.all_gather(torch.zeros(SMALL if rank == 0 else LARGE), group)
    return raised.value.code, str(raised.value), time.monotonic() - start


# Note [Lane or group] (collectives/internal/host_lane.h): members whose tensors differ across the
# lane's size limit used to wait on different paths for the full timeout, each blaming a missing
# peer; now both are refused at once, naming both calls.
def test_members_split_between_the_host_lane_and_gloo_are_refused_at_once():
    results = run_world(2, _split)
    codes = [code for code, _, _ in results]
    assert "FAILED_PRECONDITION" in codes, results
    assert set(codes) <= {"FAILED_PRECONDITION", "UNAVAILABLE"}, results
    assert all(seconds < 20 for _, _, seconds in results), results  # the timeout is 60 s
    named = [m for c, m, _ in results if c == "FAILED_PRECONDITION"]
    assert any(f"{LARGE * 4} bytes per member through the group" in m for m in named), results


def _adopt_late(rank, world_size, late):
    import time
    group = dist.new_group([0, 1])
    if rank == late:
        time.sleep(5)
    attempts = []
    for _ in range(3):
        start = time.monotonic()
        try:
            distributed.has_host_lane(group, timeout=3)
            outcome = "connected"
        except errors.LockstepError as e:
            outcome = e.code
        attempts.append((outcome, time.monotonic() - start))
    dist.barrier()  # rank 0 serves the store: it stays until the other rank is done with it
    return attempts


# Note [Waits poll] (collectives/rendezvous.cc): the members' adoption counts never line up here
# (one arrives 5 s late, each gives up after 3 s and retries), so every attempt times out within
# its own 3 s. Waiting inside LibTorch 1.13's TCPStore instead left stray replies on the
# connection: retries waited past their timeout, and one "connected" a lane its peer never joined.
@pytest.mark.parametrize("late", [0, 1], ids=["the store's rank late", "the other rank late"])
def test_an_adoption_retried_after_a_timeout_waits_only_its_own_timeout(late):
    for rank, attempts in enumerate(run_world(2, _adopt_late, late, store="tcp")):
        for outcome, seconds in attempts:
            assert outcome == "DEADLINE_EXCEEDED", (rank, attempts)
            assert seconds < 3 + 2.5, (rank, attempts)


def _temporaries_then_synchronize(rank, world_size, iterations):
    from lockstep import rng
    os.environ["LOCKSTEP_HOST_LANE"] = "0"
    group = dist.new_group([0, 1])
    streams = rng.RankStreams()
    for i in range(iterations):
        distributed.all_reduce_sum(torch.full((LARGE,), float(i)), group)
    for _ in range(20):
        rng.synchronize(group, streams)  # a Gloo worker may free a temporary meanwhile
    return "ok"


def test_synchronize_after_many_temporaries_does_not_deadlock():
    assert run_world(2, _temporaries_then_synchronize, 300, timeout=100) == ["ok", "ok"]


def _blocking_calls(group):
    """Each blocking binding, as a call on `group` (both ranks make the same one)."""
    from lockstep import rng
    streams = rng.RankStreams()
    return {
        "rng.synchronize": lambda: rng.synchronize(group, streams),
        "distributed.all_reduce_sum": lambda: distributed.all_reduce_sum(torch.ones(LARGE), group),
        "distributed.all_gather": lambda: distributed.all_gather(torch.ones(LARGE), group),
        "distributed.gather_rows": lambda: distributed.gather_rows(torch.ones(4, 8), 4, group),
        "distributed.reduce_from_group":
            lambda: distributed.reduce_from_group(torch.ones(LARGE), group),
    }


def _ticks_during(rank, world_size, name):
    import threading
    import time
    os.environ["LOCKSTEP_HOST_LANE"] = "0"
    group = dist.new_group([0, 1])
    call = _blocking_calls(group)[name]
    call()  # connections made before the measured call
    ticks, stop = [0], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.005)

    thread = threading.Thread(target=ticker)
    thread.start()
    if rank == 1:
        time.sleep(1.0)  # rank 0 waits in the call for about a second
    before = ticks[0]
    call()
    during = ticks[0] - before
    stop.set()
    thread.join()
    return during


# A blocking call that kept the GIL while it waits for its peers would stop every other Python
# thread (and deadlock with a Gloo worker that must free a Python tensor): a ticker thread counts
# how far Python got while rank 0 waited about a second for rank 1.
@pytest.mark.parametrize("name", ["distributed.all_gather", "distributed.all_reduce_sum",
                                  "distributed.gather_rows", "distributed.reduce_from_group",
                                  "rng.synchronize"])
def test_every_blocking_binding_releases_the_gil_while_it_waits(name):
    waiting, _ = run_world(2, _ticks_during, name)
    assert waiting >= 50, f"{name}: only {waiting} ticks of another thread during a 1 s wait"
