"""The Python-side proofs on a GPU: the module recorder, the operator recorder naming a planted
CUDA nondeterminism (floating-point atomics) by operator and module, repeatability of a CUDA
step in deterministic mode, and a capture of CUDA state. Skipped where there is no CUDA."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from lockstep import controls, recording, replay, rng, variability

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


def model_and_step():
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()),
                                torch.nn.Linear(256, 64)).cuda()
    batches = [torch.randn(32, 64, device="cuda", generator=None) for _ in range(3)]

    def step():
        total = torch.zeros((), device="cuda")
        for x in batches:
            loss = torch.nn.functional.dropout(model(x), 0.1).square().mean()
            loss.backward()
            total += loss.detach()
        return {"loss": total}

    return model, step


def test_a_cuda_step_is_repeatable_and_a_planted_atomic_sum_is_named():
    model, step = model_and_step()
    streams = rng.RankStreams(cuda_device=0)
    result = variability.repeatability(step, model, streams=streams)
    assert result, result.detail
    handle = controls.plant_nondeterminism(model[2])
    broken = variability.repeatability(step, model, streams=streams)
    handle.remove()
    assert not broken, broken.detail
    assert broken.evidence["first_divergence"]["module"] == "2", broken.detail


def test_the_operator_recorder_names_index_add_in_its_module(tmp_path):
    model, step = model_and_step()
    handle = controls.plant_nondeterminism(model[2])
    for name in ("a", "b"):
        torch.manual_seed(1)
        with recording.OperatorRecorder(tmp_path / f"{name}.jsonl", module=model):
            step()
    handle.remove()
    d = recording.first_operator_divergence(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    found = d.first_outputs_differ
    assert found is not None and found["module"] == "2", d.summary
    assert found["op"].startswith("aten::index_add"), d.summary


def test_a_capture_of_cuda_state(tmp_path):
    model, step = model_and_step()
    optimizer = torch.optim.AdamW(model.parameters())
    step()
    optimizer.step()
    replay.capture_state(tmp_path, 1, model=model, optimizer=optimizer,
                         streams=rng.RankStreams(cuda_device=0), data_position=1,
                         absent={"ledger": "none", "python_random": "unused",
                                 "numpy_random": "unused"}, rank=0, world_size=1)
    with open(tmp_path / "step1" / "rank0" / "index.json") as f:
        paths = json.load(f)["paths"]
    assert "rng/caller/cuda" in paths and "gradients/0.weight" in paths


def test_deterministic_mode_before_cuda_work_then_cublas_runs():
    env = dict(os.environ)
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    code = textwrap.dedent("""
        import torch, lockstep
        lockstep.determinism.enforce()
        a = torch.randn(256, 256, device="cuda")
        print("ok", float((a @ a).sum()) == float((a @ a).sum()))
        lockstep.determinism.verify()
    """)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ok True" in done.stdout, done.stdout + done.stderr
