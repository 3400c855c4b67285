"""The seed's question answered end to end on the Qwen-shaped LoRA program (train.py), on the
CPU at a small size, through ``python3 -m lockstep.verify`` with two ranks: two actors that load
one saved state have equal inventories and context digests, and warmup, warm1 and warm2 (three
backward passes, no optimizer update) agree bit for bit on every LoRA gradient; with a
nondeterministic operator planted in layers.1.mlp, the check fails and names the operator, the
module, and that the difference entered through the gradients' incoming contributions; the page
shows it."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LORA_PARAMETERS = 2 * 7 * 2  # two layers, seven projections, lora_A and lora_B


def verify(out, *flags):
    """Runs the command over train.py; its exit status, output and evidence."""
    done = subprocess.run(
        [sys.executable, "-m", "lockstep.verify", f"--out={out}", "--nproc=2", "--timeout=300",
         "--", sys.executable, os.path.join(HERE, "train.py"),
         f"--init={out}.init.safetensors", *flags],
        capture_output=True, text=True, timeout=900, env=dict(os.environ, MPLCONFIGDIR=str(out)))
    with open(os.path.join(out, "evidence.json")) as f:
        return done.returncode, done.stdout + done.stderr, json.load(f), out


def checks(evidence):
    return {c["name"]: c for c in evidence["checks"]}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return verify(tmp_path_factory.mktemp("v") / "clean")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return verify(tmp_path_factory.mktemp("v") / "planted", "--plant=layers.1.mlp")


def test_two_actors_agree_bit_for_bit(clean):
    code, out, evidence, _ = clean
    assert code == 0, out
    by = checks(evidence)
    assert set(by) == {"repeatability", "repeatability_b", "actors"}
    for rank in by["actors"]["ranks"]:
        ev = rank["evidence"]
        assert ev["inventory_a"]["state_digest"] == ev["inventory_b"]["state_digest"]
        assert ev["inventory_a"]["tensors"] == 2 * (26 + 14 * 3) + 3  # weights, AdamW state
        assert ev["context_a"]["digest"] == ev["context_b"]["digest"]
        grads = [t for t in ev["tensors"]["tensors"] if t["name"].startswith("grad/")]
        assert len(grads) == LORA_PARAMETERS and all(t["bitwise_equal"] for t in grads)
    for rank in by["repeatability"]["ranks"]:
        report = rank["evidence"]["report"]
        assert report["warm2_vs_warm1"]["passed"] == LORA_PARAMETERS + 1  # and the loss


def test_a_planted_operator_is_named_down_to_the_operator_and_module(planted):
    code, out, evidence, folder = planted
    assert code == 1, out
    by = checks(evidence)
    assert not by["repeatability"]["passed"] and not by["actors"]["passed"]
    actors = by["actors"]["ranks"][0]["evidence"]
    assert actors["first_divergence"]["module"] == "layers.1.mlp", actors["first_divergence"]
    found = actors["operators"]["first_outputs_differ"]
    assert found["op"] == "lockstep_controls::shuffled_sum" and found["module"] == "layers.1.mlp"
    verdicts = {leaf["parameter"]: leaf["verdict"] for leaf in actors["leaf_gradients"]}
    assert verdicts["layers.0.self_attn.q_proj.lora_A"] == "incoming", verdicts
    assert "lockstep_controls::shuffled_sum in layers.1.mlp" in by["actors"]["ranks"][0]["detail"]
    page = os.path.join(folder, "report", "index.html")
    if os.path.exists(page):
        text = open(page).read()
        assert "lockstep_controls::shuffled_sum in layers.1.mlp" in text
        assert "first divergence: layers.1.mlp" in text
    else:
        pytest.skip(f"no report page ({out.splitlines()[-1]})")


def test_a_program_that_does_not_cooperate_is_named(tmp_path):
    program = tmp_path / "plain.py"
    program.write_text("print('a program that never calls lockstep.verify.program')\n")
    done = subprocess.run([sys.executable, "-m", "lockstep.verify", f"--out={tmp_path / 'v'}",
                           "--", sys.executable, str(program)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "does the program call lockstep.verify.program" in done.stdout, done.stdout


def test_bad_arguments_are_refused_naming_the_value(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "old.json").write_text("{}")
    for flags, named in ((["--out", str(tmp_path / "used")], "is not an empty folder"),
                         (["--out", str(tmp_path / "n"), "--nproc=0"], "--nproc=0"),
                         (["--out", str(tmp_path / "t"), "--timeout=-1"], "--timeout=-1.0")):
        done = subprocess.run([sys.executable, "-m", "lockstep.verify", *flags, "--",
                               sys.executable, "-c", "pass"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and named in done.stderr, done.stderr
