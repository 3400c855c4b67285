"""lockstep.planner: plans, shards, digests, verification, bad input."""

import pytest
import torch

from lockstep import errors, planner


def test_every_token_is_owned_by_exactly_one_cp_rank():
    plan = planner.plan_microbatches([5, 17, 3, 30, 9], max_tokens=32, cp_size=2)
    assert plan.num_tokens == 64 and plan.num_sequences == 5 and plan.cp_size == 2
    plan.verify()
    for i in range(plan.num_microbatches):
        mb = plan.microbatch(i)
        owned = torch.cat([plan.shard_token_indices(i, r) for r in range(2)])
        assert sorted(owned.tolist()) == list(range(mb["num_tokens"]))
        assert plan.position_ids(i).shape == (mb["num_tokens"],)
    assert 0 < plan.packing_efficiency <= 1


def test_token_mean_weights_sum_to_one_and_prompt_weights_count():
    plan = planner.plan_microbatches([4, 4], 8, loss_weights=[[0, 0, 1, 1], [1, 1, 1, 1]])
    total = sum(plan.token_loss_weights(i).sum().item() for i in range(plan.num_microbatches))
    assert total == pytest.approx(1.0)


def test_digest_and_bytes_round_trip():
    a = planner.plan_microbatches([6, 6, 6], 12, cp_size=2)
    b = planner.plan_microbatches([6, 6, 6], 12, cp_size=2)
    assert a.digest == b.digest and len(a.digest) == 64
    assert planner.plan_microbatches([6, 6, 7], 12, cp_size=2).digest != a.digest
    again = planner.parse_plan(a.serialize(), [6, 6, 6])
    assert again.digest == a.digest
    with pytest.raises(errors.LockstepError):
        planner.parse_plan(a.serialize()[:-3], [6, 6, 6])
    with pytest.raises((ValueError, errors.LockstepError)):
        planner.parse_plan(a.serialize(), [6, 6, 5])  # not this batch's plan


def test_split_halves_a_microbatch():
    plan = planner.plan_microbatches([8, 8], 16)
    assert plan.num_microbatches == 1
    split = plan.split(0)
    assert split.num_microbatches == 2 and split.num_tokens == 16
    split.verify()


def test_bad_input_names_the_value_and_the_limit():
    with pytest.raises(ValueError, match="40"):
        planner.plan_microbatches([40], 32)
    with pytest.raises(ValueError, match="packing"):
        planner.plan_microbatches([4], 8, packing="best")
    with pytest.raises(ValueError, match="ids"):
        planner.plan_microbatches([4, 4], 8, ids=[1])
    with pytest.raises(ValueError, match="outside"):
        planner.plan_microbatches([4], 8).shard_token_indices(3, 0)
    with pytest.raises(TypeError):
        planner.plan_microbatches("4", 8)
