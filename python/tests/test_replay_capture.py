"""lockstep.replay: a Python program's state captured in the format tools/replay compares (the
optimizer's state by parameter, every stream, Python's random and NumPy's global generator or
their declared absence), with nothing skipped silently and nothing overwritten."""

import json
import random

import numpy
import pytest
import torch

from lockstep import errors, replay, rng

ABSENT = {"ledger": "this test keeps no ledger"}


def trained():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def index(root, step=1, rank=0):
    with open(root / f"step{step}" / f"rank{rank}" / "index.json") as f:
        return json.load(f)


def test_a_capture_holds_every_part_in_order(tmp_path):
    model, optimizer = trained()
    streams = rng.RankStreams()
    replay.capture_state(tmp_path, 1, model=model, optimizer=optimizer, streams=streams,
                         data_position=1, python_random=True, numpy_random=True, absent=ABSENT,
                         rank=0, world_size=1)
    i = index(tmp_path)
    paths = i["paths"]
    assert paths[0] == "data/position" and "rng/caller/cpu" in paths
    assert paths.index("rng/program/python_random") < paths.index("optimizer/0.weight/exp_avg")
    assert "rng/program/numpy_random" in paths
    assert "weights/1.running_mean" in paths and "gradients/0.weight" in paths
    assert i["components"]["ledger"] == {"present": False, "reason": ABSENT["ledger"]}
    assert i["program_rng"]["python_random"] == {"present": True}
    assert (tmp_path / "step1" / "rank0" / "complete.json").exists()


def test_an_undeclared_generator_or_component_is_refused_by_name(tmp_path):
    model, optimizer = trained()
    with pytest.raises(ValueError, match="python_random"):
        replay.capture_state(tmp_path, 1, model=model, absent=ABSENT, numpy_random=True)
    with pytest.raises(errors.InvalidArgumentError, match="'optimizer'"):
        replay.capture_state(tmp_path, 1, model=model, data_position=0,
                             streams=rng.RankStreams(), python_random=True, numpy_random=True,
                             absent=ABSENT, rank=0, world_size=1)
    assert not (tmp_path / "step1").exists()


def test_a_capture_is_never_overwritten(tmp_path):
    model, optimizer = trained()
    kwargs = dict(model=model, optimizer=optimizer, streams=rng.RankStreams(), data_position=1,
                  absent=dict(ABSENT, python_random="unused", numpy_random="unused"), rank=0,
                  world_size=1)
    replay.capture_state(tmp_path, 1, **kwargs)
    with pytest.raises(errors.AlreadyExistsError):
        replay.capture_state(tmp_path, 1, **kwargs)


def test_python_and_numpy_generators_round_trip():
    random.seed(11)
    random.gauss(0, 1)  # leaves a cached gaussian in the state
    numpy.random.seed(12)
    numpy.random.standard_normal()
    saved_random, saved_numpy = replay.python_random_state(), replay.numpy_random_state()
    want = (random.random(), random.gauss(0, 1), numpy.random.random(),
            numpy.random.standard_normal())
    replay.restore_python_random(saved_random)
    replay.restore_numpy_random(saved_numpy)
    got = (random.random(), random.gauss(0, 1), numpy.random.random(),
           numpy.random.standard_normal())
    assert got == want


def test_a_generator_declared_absent_without_a_reason_is_refused(tmp_path):
    model, optimizer = trained()
    with pytest.raises(errors.InvalidArgumentError, match="python_random"):
        replay.capture_state(tmp_path, 1, model=model, optimizer=optimizer,
                             streams=rng.RankStreams(), data_position=1, numpy_random=True,
                             absent=dict(ABSENT, python_random=""), rank=0, world_size=1)
