"""The Python twin of the example end to end (examples/lm/python/train.py), the same checks as
examples/lm/train_test.sh: it trains; DP2 x CP2 and TP2 x CP2 give the unsplit run's loss at every
step (numerics' default tolerance); a run resumed from saved state continues bit for bit; the
negative control (the mask's seed drawn before the hand-back) is caught."""

import os

import pytest
import torch

from lockstep import numerics

from distributed_util import run_world
import train

STEPS, HALF = 60, 30


def _run(rank, world_size, argv):
    losses, parameters = train.train(train.parse(argv))
    return {"losses": losses, "digests": [numerics.tensor_digest(p) for p in parameters]}


def run(world, *flags, steps=STEPS):
    return run_world(world, _run, [f"--steps={steps}", "--log-every=1000", *flags], timeout=900)


@pytest.fixture(scope="module")
def unsplit():
    return run(1)[0]


def test_the_loss_falls(unsplit):
    first, last = unsplit["losses"][0], unsplit["losses"][-1]
    print(f"loss {first:.4f} -> {last:.4f}")
    assert last < 0.6 * first


@pytest.mark.parametrize("flags", [("--cp=2",), ("--tp=2", "--cp=2")], ids=["DP2xCP2", "TP2xCP2"])
def test_split_runs_equal_the_unsplit_run(unsplit, flags):
    split = run(4, *flags)[0]
    result = numerics.compare(torch.tensor(split["losses"]), torch.tensor(unsplit["losses"]),
                              name="loss")
    assert result, result.json()


def test_resume_continues_bit_for_bit(tmp_path):
    whole = run(4, "--cp=2", f"--save-every={HALF}", f"--save-dir={tmp_path}")
    resumed = run(4, "--cp=2", f"--resume={os.path.join(tmp_path, f'step{HALF}')}")
    for r in range(4):
        assert resumed[r]["losses"] == whole[r]["losses"][HALF:], f"rank {r}'s losses"
        assert resumed[r]["digests"] == whole[r]["digests"], f"rank {r}'s final weights"


def test_negative_control_mask_before_the_hand_back_is_caught():
    reference = run(1, steps=20)[0]
    control = run(4, "--cp=2", "--mask-before-hand-back", steps=20)[0]
    result = numerics.compare(torch.tensor(control["losses"]),
                              torch.tensor(reference["losses"]), name="loss")
    assert not result, "the mask drawn before the hand-back went unnoticed"
