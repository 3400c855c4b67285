"""lockstep.numerics: comparisons with the library's figures, inventories with its digests."""

import copy
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from lockstep import numerics


def test_compare_reports_the_figures():
    a = torch.tensor([1.0, 2.0, 3.0])
    result = numerics.compare(a, a.clone(), name="x")
    assert result and result.passed and result.bitwise_equal and result.max_abs_diff == 0
    off = numerics.compare(a + torch.tensor([0.0, 0.5, 0.0]), a, name="x")
    assert not off and off.over_tolerance == 1 and off.first_offending_index == [1]
    assert off.max_abs_diff == pytest.approx(0.5)
    assert json.loads(off.json())["name"] == "x"
    assert numerics.compare(a + 1e-7, a)  # within the default tolerance
    assert not numerics.compare(a + 1e-7, a, bitwise=True)
    with pytest.raises(ValueError):
        numerics.compare(a, a, atol=-1.0)


def test_compare_state_of_two_models():
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    n = torch.nn.Linear(3, 2)
    n.load_state_dict(m.state_dict())
    assert numerics.compare_state(m, n, bitwise=True)
    with torch.no_grad():
        n.bias[0] += 1
    result = numerics.compare_state(m, n)
    assert not result and result.failed == 1 and result.worst_by_tolerance_ratio[0] == "bias"
    missing = numerics.compare_state({"w": m.weight}, {"w": m.weight, "v": m.bias})
    assert missing.failed == 1


def test_inventory_digests_match_the_reference_and_a_file(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    inv = numerics.inventory((model, optimizer))
    names = [e["name"] for e in inv.entries]
    assert "optimizer/weight/exp_avg" in names and "optimizer/bias/step" in names
    assert len(inv.state_digest) == 32
    # The fields read from the library directly agree with its JSON (written only when asked).
    fields = json.loads(inv.json())
    assert (inv.state_digest, inv.tensors, inv.bytes) == (
        fields["state_digest"], fields["tensors"], fields["bytes"])
    assert inv.tensors == len(names) and inv.as_dict()["digest_version"] == 1
    # Pickled and copied as its JSON, and made again from that JSON.
    copies = (pickle.loads(pickle.dumps(inv)), copy.deepcopy(inv), numerics.Inventory(inv.json()))
    for again in copies:
        assert (again.state_digest, again.tensors, again.bytes, again.entries) == (
            inv.state_digest, inv.tensors, inv.bytes, inv.entries)
    # A tensor's digest is the same however it is held (contiguous or not).
    t = torch.arange(12.0).reshape(3, 4)
    assert numerics.tensor_digest(t.t().contiguous()) == numerics.tensor_digest(
        t.t().clone(memory_format=torch.contiguous_format))
    # The digest reference (numerics/digest_reference.py) over the same file agrees.
    reference = os.environ.get("DIGEST_REFERENCE")
    if reference is None:
        pytest.skip("DIGEST_REFERENCE not set (run through bazel test //python:numerics_test)")
    path = tmp_path / "state.safetensors"
    _write_safetensors(path, {"a": t, "b": torch.tensor([1, 2], dtype=torch.int64)})
    from_file = numerics.inventory(path)
    in_memory = numerics.inventory({"a": t, "b": torch.tensor([1, 2], dtype=torch.int64)})
    assert from_file.state_digest == in_memory.state_digest
    out = subprocess.run([sys.executable, reference, str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert from_file.state_digest in out


def _write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    names = {torch.float32: "F32", torch.int64: "I64"}
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_a_named_set_passed_as_held_digests_as_its_detached_copy(tmp_path):
    """Note [Named sets as given]: inventories, comparisons and safetensors files take the
    program's tensors without detaching them; the library reads them without autograd."""
    import gc
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    # A non-contiguous view that requires grad: reading it takes a contiguous copy.
    leaf = torch.randn(5, 7, requires_grad=True)
    held = [("t", leaf.t()), ("w", model[0].weight)]
    detached = [(name, t.detach()) for name, t in held]
    assert numerics.inventory(held).state_digest == numerics.inventory(detached).state_digest
    assert numerics.inventory((model, optimizer)).state_digest == numerics.inventory(
        numerics.module_state(model, optimizer)).state_digest
    assert numerics.compare_state(held, detached, bitwise=True)
    numerics.write_safetensors(tmp_path / "held.safetensors", held)
    numerics.write_safetensors(tmp_path / "detached.safetensors", detached)
    assert (tmp_path / "held.safetensors").read_bytes() == (
        tmp_path / "detached.safetensors").read_bytes()
    assert leaf.grad is None and held[0][1].grad_fn is not None  # the view, untouched
    assert all(not t.requires_grad for _, t in numerics.module_state(model, optimizer))
    # The collector is paused while a named set is built, and left as it was.
    assert gc.isenabled()
    gc.disable()
    try:
        numerics.module_state(model, optimizer)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_inventory_of_a_damaged_file_is_an_error(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\xff" * 12)
    with pytest.raises((ValueError, RuntimeError)):
        numerics.inventory(path)
