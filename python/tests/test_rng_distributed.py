"""lockstep.rng across processes (torch.distributed, Gloo, 127.0.0.1): after synchronize the
caller's draws and masks agree inside each TP x CP group, DP groups stay independent, the model
stream agrees and advances, an exception inside the scope restores the caller; the negative
controls (no synchronize; model work drawn from the caller's stream) are caught."""

import pytest
import torch
import torch.distributed as dist

from lockstep import errors, rng

from distributed_util import groups_of, run_world

LAYOUTS = {"DP1xCP2": (2, 2, 1), "DP2xCP2": (4, 2, 1), "TP2xCP2": (4, 2, 2)}


def _step(rank, world_size, cp, tp, synchronized, model_on_caller):
    """One step of a trainer's RNG use; returns the draws the test compares."""
    group = groups_of(world_size, cp, tp)
    torch.manual_seed(100 + rank // (tp * cp))  # DP replicas seeded apart, the group alike
    streams = rng.RankStreams()
    rng.synchronize(group, streams)
    with rng.model_stream(streams):
        pass  # the model stream starts here, from the agreed caller state
    if group is not None and dist.get_rank(group) == 0:
        torch.rand(17)  # the leader samples: its caller state moves ahead
    if model_on_caller:
        model = torch.rand(8)  # the bug: model work on the caller's stream
    else:
        with rng.model_stream(streams):
            model = torch.rand(8)
    if synchronized:
        rng.synchronize(group, streams)
    caller = torch.rand(8)
    mask = torch.rand(8) < 0.5
    with rng.model_stream(streams):
        model_next = torch.rand(8)
    try:
        with rng.model_stream(streams):
            torch.rand(3)
            raise RuntimeError("a failing forward")
    except RuntimeError:
        pass
    restored = torch.rand(4)
    # Lists, not tensors: tensors would cross the result queue through shared memory.
    return {"model": model.tolist(), "caller": caller.tolist(), "mask": mask.tolist(),
            "model_next": model_next.tolist(), "restored": restored.tolist(),
            "live": streams.caller_state_live}


def _agree(results, tp, cp):
    size = tp * cp
    for g in range(len(results) // size):
        first = results[g * size]
        for r in range(g * size, (g + 1) * size):
            for key in ("model", "caller", "mask", "model_next", "restored"):
                if results[r][key] != first[key]:
                    return False, f"rank {r}'s {key} differs from rank {g * size}'s"
    return True, ""


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_draws_agree_inside_groups_and_dp_stays_independent(layout):
    world, cp, tp = LAYOUTS[layout]
    results = run_world(world, _step, cp, tp, True, False)
    ok, why = _agree(results, tp, cp)
    assert ok, why
    for r in results:
        assert r["live"]
        assert r["model"] != r["model_next"], "the model stream advances"
    if world // (tp * cp) > 1:
        assert results[0]["caller"] != results[tp * cp]["caller"]
        assert results[0]["model"] != results[tp * cp]["model"]


@pytest.mark.parametrize("control", ["no_synchronize", "model_on_caller_stream"])
def test_negative_controls_are_caught(control):
    results = run_world(4, _step, 2, 1, control != "no_synchronize",
                        control == "model_on_caller_stream")
    ok, why = _agree(results, 1, 2)
    assert not ok, f"{control} went unnoticed"


def _not_a_member(rank, world_size):
    group = dist.new_group([0])
    if rank == 0:
        rng.synchronize(group, rng.RankStreams())
        return "member"
    with pytest.raises(ValueError, match="not a member"):
        rng.synchronize(group, rng.RankStreams())
    return "refused"


def test_a_group_the_rank_is_not_in_is_refused():
    assert run_world(2, _not_a_member) == ["member", "refused"]


def _peer_gone(rank, world_size):
    group = dist.new_group([0, 1])
    streams = rng.RankStreams()
    if rank == 1:
        return "gone"  # the process ends here, before the collective
    with pytest.raises(errors.LockstepError) as raised:
        rng.synchronize(group, streams, timeout=5)
    return type(raised.value).__name__


def test_a_dead_peer_is_an_error_not_a_hang():
    import time
    start = time.monotonic()
    results = run_world(2, _peer_gone, timeout=60)
    assert results[0] in ("UnavailableError", "DeadlineExceededError"), results
    assert results[1] == "gone"
    assert time.monotonic() - start < 30
