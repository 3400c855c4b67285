"""lockstep.trainer.TrainerRank from Python under torch.distributed (Gloo, 127.0.0.1): outputs
and gradients equal an unsplit reference written in plain PyTorch here, the caller's draws agree
after each hand-back, a failing forward is an error on every replica and the trainer stays
usable, saved state restores, custom objects take the leader's values; the negative control (a
dropout mask indexed by the position inside the shard) is caught at CP 2 and harmless at CP 1.
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from lockstep import errors, rng
from lockstep.trainer import TrainerRank

from distributed_util import groups_of, run_world

HIDDEN, P, LENGTHS, MAX_TOKENS = 6, 0.25, [7, 3, 12, 5, 1], 16
LAYOUTS = {"DP1xCP2": (2, 2, 1), "DP2xCP2": (4, 2, 1), "TP2xCP2": (4, 2, 2)}


def model_weights():
    return torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(42))


def batch(dp_rank):
    g = torch.Generator().manual_seed(1000 + dp_rank)
    return torch.randn(sum(LENGTHS), HIDDEN, generator=g)


def global_mask(step):
    """Dropout keep-mask of every (sequence, position, feature): the same in any split."""
    return rng.partitioned_dropout_mask(7, 1, step, [len(LENGTHS), max(LENGTHS), HIDDEN],
                                        [(0, len(LENGTHS)), (0, max(LENGTHS)), (0, HIDDEN)], P)


def reference(rows, weight, step):
    """The unsplit model in plain PyTorch: each token's tanh(x W), dropped by its mask."""
    mask = global_mask(step)
    out, begin = [], 0
    for s, n in enumerate(LENGTHS):
        out.append(torch.tanh(rows[begin:begin + n] @ weight) * mask[s, :n] / (1 - P))
        begin += n
    return torch.cat(out)


def shard_local_positions(work):
    """Each token's position counted from the start of its shard piece (the bug's index): the
    same as ``work.positions`` when the shard holds whole sequences, as at CP 1."""
    pos, ids = work.positions, work.sequence_ids
    local, start = pos.clone(), 0
    for t in range(1, len(pos) + 1):
        if t == len(pos) or ids[t] != ids[t - 1] or pos[t] != pos[t - 1] + 1:
            local[start:t] = pos[start:t] - pos[start]
            start = t
    return local


def make_forward(weight, step, shard_dependent=False, fail_on=None):
    def forward(work):
        if fail_on is not None and dist.get_rank() == fail_on:
            raise ValueError("the model broke on this rank")
        h = torch.tanh(work.inputs @ weight)
        # The bug (shard_dependent): the global mask indexed by the position inside the shard's
        # piece instead of the position in the sequence.
        positions = shard_local_positions(work) if shard_dependent else work.positions
        mask = global_mask(step[0])[work.sequence_ids, positions]
        return h * mask / (1 - P)
    return forward


def _train(rank, world_size, cp, tp, shard_dependent):
    group = groups_of(world_size, cp, tp)
    size = tp * cp
    dp_rank = rank // size
    torch.manual_seed(dp_rank)
    streams = rng.RankStreams()
    weight = model_weights().requires_grad_()
    step = [0]
    trainer = TrainerRank(make_forward(weight, step, shard_dependent), streams, group, tp=tp,
                          cp=cp, max_tokens=MAX_TOKENS)
    rows = batch(dp_rank)
    outputs, draws = [], []
    for out in trainer.forward_microbatches(rows, LENGTHS):
        draws.append(torch.rand(2).tolist())  # the caller's draw right after a hand-back
        if dist.get_rank(group) == 0:
            torch.rand(9)  # the leader samples between hand-backs
        full = torch.zeros(sum(LENGTHS), HIDDEN)
        full[out.input_rows] = out.outputs.detach()
        outputs.append(full.tolist())
        (out.outputs * out.loss_weights[:, None]).sum().backward()
    grad = weight.grad.clone()
    if tp == 1:
        dist.all_reduce(grad, group=group)  # CP: each rank back-propagated its own tokens
    return {"outputs": outputs, "draws": draws, "grad": grad.tolist(), "dp": dp_rank,
            "live": streams.caller_state_live}


def _reference_outputs(dp_rank):
    weight = model_weights().requires_grad_()
    rows = batch(dp_rank)
    out = reference(rows, weight, 0)
    (out / sum(LENGTHS)).sum().backward()  # token mean: every weight is 1 / tokens
    return out.detach(), weight.grad


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_outputs_and_gradients_equal_the_unsplit_reference(layout):
    world, cp, tp = LAYOUTS[layout]
    results = run_world(world, _train, cp, tp, False)
    for r in results:
        expected, expected_grad = _reference_outputs(r["dp"])
        got = torch.zeros_like(expected)
        for full in r["outputs"]:
            got += torch.tensor(full)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        if tp == 1:
            torch.testing.assert_close(torch.tensor(r["grad"]), expected_grad, rtol=1e-5,
                                       atol=1e-6)
        assert r["live"]
    size = tp * cp
    for g in range(world // size):
        for r in range(g * size, (g + 1) * size):
            assert results[r]["draws"] == results[g * size]["draws"], f"rank {r}'s draws"
    if world // size > 1:
        assert results[0]["draws"] != results[size]["draws"], "DP workers stay independent"


def _summed_outputs(result):
    expected, _ = _reference_outputs(result["dp"])
    got = torch.zeros_like(expected)
    for full in result["outputs"]:
        got += torch.tensor(full)
    return got, expected


def test_negative_control_shard_local_index_is_caught():
    got, expected = _summed_outputs(run_world(2, _train, 2, 1, True)[0])
    assert not torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_the_shard_local_index_is_no_bug_at_cp1():
    """The control plants exactly a CP bug: with whole sequences on one rank it is correct."""
    got, expected = _summed_outputs(run_world(1, _train, 1, 1, True)[0])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def _failing_forward(rank, world_size):
    group = groups_of(world_size, 2)
    streams = rng.RankStreams()
    weight = model_weights()
    trainer = TrainerRank(make_forward(weight, [0], fail_on=1), streams, group, cp=2,
                          max_tokens=MAX_TOKENS)
    state = torch.get_rng_state()
    with pytest.raises(errors.LockstepError) as raised:
        list(trainer.forward_microbatches(batch(0), LENGTHS))
    seen = type(raised.value).__name__, str(raised.value), type(raised.value.__cause__).__name__
    assert torch.equal(torch.get_rng_state(), state), "the caller's state is as it was"
    healthy = TrainerRank(make_forward(weight, [0]), streams, group, cp=2, max_tokens=MAX_TOKENS)
    count = len(healthy.forward_all_microbatches(batch(0), LENGTHS))
    return {"error": seen, "after": count}


def test_a_failing_forward_is_an_error_on_every_replica_and_the_next_call_works():
    results = run_world(2, _failing_forward)
    kind, message, cause = results[1]["error"]
    assert cause == "ValueError" and "the model broke" in message
    kind, message, _ = results[0]["error"]
    assert kind == "AbortedError" and "global rank 1" in message, message
    assert results[0]["after"] == results[1]["after"] > 0


def _save_and_load(rank, world_size, root):
    group = groups_of(world_size, 2)
    torch.manual_seed(3)
    streams = rng.RankStreams()
    weight = model_weights().clone()

    def forward(work):
        return torch.nn.functional.dropout(work.inputs @ weight, 0.5, True)  # model stream

    trainer = TrainerRank(forward, streams, group, cp=2, max_tokens=MAX_TOKENS)
    path = os.path.join(root, f"rank{rank}")
    trainer.save_state(path, {"weight": weight})
    first = [o.outputs.tolist() for o in trainer.forward_microbatches(batch(0), LENGTHS)]
    after = torch.rand(3).tolist()
    with torch.no_grad():
        weight.add_(1.0)
    report = trainer.load_state(path, {"weight": weight})
    again = [o.outputs.tolist() for o in trainer.forward_microbatches(batch(0), LENGTHS)]
    with pytest.raises(errors.LockstepError):
        trainer.save_state(path, {"weight": weight})  # the directory exists: refused
    return {"same": first == again, "after": after == torch.rand(3).tolist(), "report": report}


def test_saved_state_restores_weights_and_streams():
    with tempfile.TemporaryDirectory() as root:
        for r in run_world(2, _save_and_load, root):
            assert r["same"] and r["after"], r
            assert r["report"] == {"weights": 1, "rng_streams": True}


def _custom_objects(rank, world_size):
    group = groups_of(world_size, 2)
    torch.manual_seed(rank)  # the replicas' factories draw different values
    trainer = TrainerRank(make_forward(model_weights(), [0]), rng.RankStreams(), group, cp=2,
                          max_tokens=MAX_TOKENS)
    runs = [0]

    def factory():
        runs[0] += 1
        return [("w", torch.randn(3, 4))]

    head = trainer.register_custom_object("head", factory, metadata="linear")
    again = trainer.register_custom_object("head", factory, metadata="linear")
    with pytest.raises(errors.LockstepError) as kind:
        trainer.register_custom_object("head", factory, metadata="conv")
    with pytest.raises(errors.LockstepError) as shape:
        trainer.register_custom_object(
            "other", lambda: [("w", torch.zeros(4, 3) if rank == 1 else torch.zeros(3, 4))])
    mine = torch.full((4, 3), float(rank + 1)).t()  # non-contiguous: a transposed view
    transposed = trainer.register_custom_object("head_t", lambda: [("w", mine)])
    return {"head": head[0][1].tolist(), "name": head[0][0], "again": again[0][1].tolist(),
            "runs": runs[0], "kind": str(kind.value), "shape": str(shape.value),
            "mine": mine.tolist(), "returned": transposed[0][1].tolist()}


def test_custom_objects_take_the_leaders_values_all_or_nothing():
    leader, other = run_world(2, _custom_objects)
    assert leader["name"] == "w"
    assert other["head"] == leader["head"], "the leader's values did not win"
    assert other["again"] == leader["head"] and other["runs"] == leader["runs"] == 1, \
        "registering twice ran the factory again or returned other values"
    for r in (leader, other):
        assert "registered already with metadata 'linear'" in r["kind"], r["kind"]
        assert "global rank 1" in r["shape"] and "nothing registered" in r["shape"], r["shape"]
        # The non-contiguous tensor the factory returned holds the leader's values in place.
        assert r["mine"] == [[1.0] * 4] * 3 and r["returned"] == r["mine"], r["mine"]
