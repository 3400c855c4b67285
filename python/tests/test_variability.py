"""lockstep.variability: repeatability (cold, warm1, warm2) of a Python step with every generator
restored between passes, a planted nondeterministic module named with each gradient's entry
point, and the actors check over two fresh processes loading one saved state."""

import os
import random
import subprocess
import sys
import textwrap

import numpy
import torch

from lockstep import controls, rng, variability


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(),
                               torch.nn.Sequential(torch.nn.Linear(12, 12), torch.nn.ReLU()),
                               torch.nn.Linear(12, 2))


def make_step(model):
    batches = [torch.randn(5, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def step():
        total = torch.zeros(())
        for x in batches:
            # Every generator the program draws from: torch's, Python's and NumPy's.
            keep = torch.rand(5, 1) > 0.2
            scale = 1.0 + random.random() + float(numpy.random.random())
            loss = (model(x) * keep * scale).square().mean()
            loss.backward()
            total += loss.detach()
        return {"loss": total}

    return step


def test_a_deterministic_step_is_repeatable_with_every_generator_restored():
    model = make_model()
    result = variability.repeatability(make_step(model), model, streams=rng.RankStreams())
    assert result, result.detail
    report = result.evidence["report"]
    assert report["repeatable"] and result.evidence["compared"] == "warm2 vs warm1"


def test_a_planted_module_is_named_and_its_gradients_enter_incoming():
    model = make_model()
    handle = controls.plant_nondeterminism(model[2])
    result = variability.repeatability(make_step(model), model)
    handle.remove()
    assert not result, result.detail
    first = result.evidence["first_divergence"]
    assert first["module"] == "2" and first["kind"] == "forward_output", first
    verdicts = {leaf["parameter"]: leaf["verdict"] for leaf in result.evidence["leaf_gradients"]}
    assert verdicts.get("0.weight") == "incoming", verdicts
    # The residue enters in the forward, so every differing gradient differs as it arrives.
    assert set(verdicts.values()) == {"incoming"}, verdicts
    assert first["index"] > 0  # the modules before it agreed


ACTOR = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import test_variability as t
    from lockstep import rng, variability
    mode, directory, prefix = sys.argv[1:4]
    model = t.make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    streams = rng.RankStreams()
    if mode == "save":
        t.make_step(model)()
        optimizer.step()
        variability.save_state(directory, model, optimizer, streams=streams, rank=0)
    else:
        load = None
        if mode == "partial":  # the planted bug: the load leaves the optimizer's state behind
            load = lambda d, m, o, streams, rank: variability.load_state(d, m, None,
                                                                         streams=streams, rank=rank)
        variability.run_actor(directory, prefix, t.make_step(model), model, optimizer,
                              streams=streams, rank=0, caller={{"actor": "x"}}, load=load)
""")


def actor(tmp_path, mode, prefix):
    script = tmp_path / "actor.py"
    script.write_text(ACTOR.format(tests=os.path.dirname(__file__)))
    done = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "state"),
                           str(tmp_path / prefix)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_actors_that_load_one_state_agree(tmp_path):
    actor(tmp_path, "save", "")
    actor(tmp_path, "actor", "a")
    actor(tmp_path, "actor", "b")
    result = variability.compare_actors(tmp_path / "a", tmp_path / "b", rank=0)
    assert result, result.detail
    assert result.evidence["context_differences"] == []
    assert result.evidence["inventory_a"]["state_digest"] == \
        result.evidence["inventory_b"]["state_digest"]
    assert (tmp_path / "a.rank0.ops.jsonl").exists()


def test_an_actor_that_loads_less_than_was_saved_is_named(tmp_path):
    actor(tmp_path, "save", "")
    actor(tmp_path, "partial", "a")
    actor(tmp_path, "partial", "b")
    result = variability.compare_actors(tmp_path / "a", tmp_path / "b", rank=0)
    assert not result, result.detail
    assert "restored less than was saved" in result.detail
    assert any(name.startswith("optimizer/") for name in result.evidence["saved_vs_loaded_a"])


def test_verify_writes_no_log_through_a_planted_link(tmp_path):
    from lockstep import verify
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out" / "logs").mkdir(parents=True)
    (tmp_path / "out" / "logs" / "save.rank0.log").symlink_to(victim)
    failure = verify._launch("save", [sys.executable, "-c", "print('written')"], 1,
                             str(tmp_path / "out"), 60, {})
    assert victim.read_text() == "keep"
    assert failure is not None and "save: cannot write its log" in failure, failure


def test_write_text_writes_through_no_link_at_a_name_known_in_advance(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "evidence.json"
    for name in (f"{path}.tmp{os.getpid()}", f"{path}.tmp"):  # the names a temporary once had
        os.symlink(victim, name)
    variability.write_text(str(path), "written")
    assert victim.read_text() == "keep" and path.read_text() == "written"
    assert not path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim", "evidence.json", f"evidence.json.tmp{os.getpid()}", "evidence.json.tmp"])
