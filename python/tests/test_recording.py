"""lockstep.recording: the module recorder on a torch.nn.Module tree (every module that ran,
gradients at outputs and inputs, each parameter's contributions and accumulated .grad), the
first divergence and the leaf localization from Python, recordings tools/diverge reads; the
operator recorder labelling calls by module and digesting inputs before an in-place write."""

import json
import os
import subprocess

import pytest
import torch

from lockstep import controls, errors, recording


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(torch.nn.Module):
    def __init__(self, width=8, blocks=2):
        super().__init__()
        torch.manual_seed(5)
        self.inp = torch.nn.Linear(width, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
        self.out = torch.nn.Linear(width, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


BATCHES = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]


def step(model):
    for x in BATCHES:  # three backwards, gradients accumulating
        model(x).square().mean().backward()


def record(model, **kwargs):
    model.zero_grad(set_to_none=True)
    with recording.ModuleRecorder(model, **kwargs) as recorder:
        step(model)
    return recorder.recording


def modules_that_ran(model):
    ran = []
    handles = [m.register_forward_hook(lambda m, i, o, n=n: ran.append(n))
               for n, m in model.named_modules() if n]
    step(model)
    for h in handles:
        h.remove()
    return set(ran)


def test_every_module_that_ran_is_recorded_forward_and_backward():
    model = Net()
    rec = record(model)
    by_kind = {}
    for r in rec.records:
        by_kind.setdefault(r["kind"], set()).add(r["module"])
    assert by_kind["forward_output"] == modules_that_ran(model)
    assert "blocks.1.mlp" in by_kind["gradient_at_output"]
    assert "blocks.1.mlp" in by_kind["gradient_at_input"]  # its input requires grad


def test_each_parameter_records_three_contributions_and_its_accumulation():
    model = Net()
    rec = record(model)
    params = [n for n, _ in model.named_parameters()]
    incoming = [r["module"] for r in rec.records if r["kind"] == "incoming_gradient"]
    accumulated = [r["module"] for r in rec.records if r["kind"] == "accumulated_gradient"]
    for name in params:
        assert incoming.count(name) == 3, name
    assert sorted(accumulated) == sorted(params)


def test_hooks_are_removed_when_the_block_ends_also_on_error():
    model = Net()
    with pytest.raises(RuntimeError, match="boom"):
        with recording.ModuleRecorder(model):
            raise RuntimeError("boom")
    record(model)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    step(model)
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters()))


def test_identical_runs_do_not_diverge_and_a_planted_module_is_named(tmp_path):
    model = Net()
    a, b = record(model, keep_full_tensors=1000), record(model, keep_full_tensors=1000)
    assert recording.first_divergence(a, b) is None
    handle = controls.plant_nondeterminism(model.blocks[1].mlp)
    c = record(model, keep_full_tensors=1000)
    handle.remove()
    first = recording.first_divergence(a, c)
    assert first is not None and first.module == "blocks.1.mlp", first
    assert first.kind == "forward_output" and first.reason == "digest"
    leaf = recording.localize_parameter_gradient(a, c, "blocks.0.mlp.0.weight")
    assert leaf.verdict == "incoming", leaf.as_dict()
    evidence = recording.compare_recordings(a, c)
    assert "blocks.1.mlp" in evidence.summary
    # Saved, the recordings are tools/diverge's.
    a.save(tmp_path / "a.rec")
    c.save(tmp_path / "c.rec")
    loaded = recording.Recording.load(tmp_path / "a.rec")
    assert len(loaded) == len(a) and recording.first_divergence(a, loaded) is None
    diverge = os.environ.get("DIVERGE")
    if diverge:
        done = subprocess.run([diverge, str(tmp_path / "a.rec"), str(tmp_path / "c.rec")],
                              capture_output=True, text=True)
        assert done.returncode == 1 and "blocks.1.mlp" in done.stdout, done.stdout + done.stderr


def test_a_file_that_is_not_a_recording_is_refused(tmp_path):
    path = tmp_path / "junk.rec"
    path.write_bytes(b"not a recording")
    with pytest.raises(errors.InvalidArgumentError):
        recording.Recording.load(path)


def read_calls(path):
    with open(path) as f:
        return [json.loads(line) for line in f][1:]


def test_operator_calls_are_labelled_by_the_module_they_ran_in(tmp_path):
    model = Net()
    with recording.OperatorRecorder(tmp_path / "ops.jsonl", module=model, label="step") as ops:
        with ops.scope("loss"):
            model(BATCHES[0]).square().mean().backward()
    calls = read_calls(tmp_path / "ops.jsonl")
    modules = {c["module"] for c in calls}
    assert {"inp", "blocks.0.norm", "blocks.1.mlp.0", "out", "loss"} <= modules, modules
    assert any(c["op"] == "aten::addmm" and c["module"] == "blocks.1.mlp.2" for c in calls)


def test_a_planted_operator_is_named_with_its_module(tmp_path):
    model = Net()
    handle = controls.plant_nondeterminism(model.blocks[0].mlp)
    for name in ("a", "b"):
        with recording.OperatorRecorder(tmp_path / f"{name}.jsonl", module=model):
            step(model)
    handle.remove()
    d = recording.first_operator_divergence(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    found = d.first_outputs_differ
    assert found["op"] == "lockstep_controls::shuffled_sum", d.summary
    assert found["module"] == "blocks.0.mlp", d.summary
    diverge = os.environ.get("DIVERGE")  # the recordings are tools/diverge's too
    if diverge:
        done = subprocess.run([diverge, str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                              capture_output=True, text=True)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "lockstep_controls::shuffled_sum in blocks.0.mlp" in done.stdout, done.stdout


def test_inputs_are_digested_before_an_in_place_write(tmp_path):
    # Two runs whose inputs differ but whose in-place writes leave equal values: digested when
    # the call starts, the inputs differ at that call; digested after the write, they would not.
    xs = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    for name, x in zip("ab", xs):
        with recording.OperatorRecorder(tmp_path / f"{name}.jsonl"):
            x.mul_(0)
    d = recording.first_operator_divergence(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert d.first_inputs_differ is not None, d.summary
    assert d.first_inputs_differ["op"] == "aten::mul_", d.summary
    assert d.first_outputs_differ is None, d.summary


def test_one_operator_recorder_at_a_time(tmp_path):
    with recording.OperatorRecorder(tmp_path / "a.jsonl"):
        with pytest.raises(errors.FailedPreconditionError):
            with recording.OperatorRecorder(tmp_path / "b.jsonl"):
                pass


def test_only_the_first_records_keep_their_tensors():
    model = Net()
    rec = record(model, keep_full_tensors=3)
    kept = [r["index"] for r in rec.records if r["kept"]]
    assert kept == [0, 1, 2], kept
    assert len(rec) > 3
