"""lockstep.checkpoint.checkpoint against torch.utils.checkpoint on a model with dropout."""

import pytest
import torch
import torch.utils.checkpoint

from lockstep import errors, rng
from lockstep.checkpoint import checkpoint, retained_state


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x, p=0.3):
        return x + self.down(torch.nn.functional.dropout(torch.relu(self.up(x)), p, True))


def run(how, seed=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    x = torch.randn(8, 16, requires_grad=True)
    torch.manual_seed(seed)
    h = x
    for block in model:
        if how == "lockstep":
            h = checkpoint(block, h, p=0.3)
        elif how == "torch":
            h = torch.utils.checkpoint.checkpoint(block, h, 0.3, use_reentrant=True)
        else:
            h = block(h, 0.3)
        torch.rand(3)  # the caller draws between the blocks' forwards and their backward
    h.square().sum().backward()
    return h.detach(), x.grad, [p.grad for p in model.parameters()], torch.get_rng_state()


def test_bitwise_equal_to_torch_utils_checkpoint_and_to_no_checkpoint():
    ours, theirs, plain = run("lockstep"), run("torch"), run("plain")
    for other in (theirs, plain):
        assert torch.equal(ours[0], other[0])
        assert torch.equal(ours[1], other[1])
        for a, b in zip(ours[2], other[2]):
            assert torch.equal(a, b)
        assert torch.equal(ours[3], other[3]), "the caller's stream after backward"
    assert retained_state() == {"nodes": 0, "rng_bytes": 0}


def test_a_checkpoint_without_replay_fails_the_same_comparison():
    # Negative control: torch.utils.checkpoint with preserve_rng_state=False recomputes with
    # other dropout masks, and the comparison above catches it.
    ours = run("lockstep")
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    x = torch.randn(8, 16, requires_grad=True)
    torch.manual_seed(5)
    h = x
    for block in model:
        h = torch.utils.checkpoint.checkpoint(block, h, 0.3, use_reentrant=True,
                                              preserve_rng_state=False)
        torch.rand(3)
    h.square().sum().backward()
    assert torch.equal(h.detach(), ours[0]), "the forwards agree"
    assert not torch.equal(x.grad, ours[1]), "the recompute without replay differs"


def test_kept_outputs_and_released_state():
    block = Block()
    x = torch.randn(4, 16, requires_grad=True)
    out = checkpoint(block, x)
    assert retained_state()["nodes"] == 1
    out.sum().backward()
    assert retained_state()["nodes"] == 0, "released after backward, while the output is held"
    del out
    out = checkpoint(block, x)
    del out
    assert retained_state()["nodes"] == 0, "released with the graph, without a backward"


def test_named_streams_replay_inside_a_model_stream_scope():
    torch.manual_seed(3)
    streams = rng.RankStreams()
    streams.add_named_stream("tp", 11)
    x = torch.randn(4, 16, requires_grad=True)
    seen = []

    def fn(t):
        with rng.named_stream(streams, "tp"):
            noise = torch.rand(t.shape)
        seen.append(noise)
        return t * noise

    with rng.model_stream(streams):
        out = checkpoint(fn, x, streams=streams)
    out.sum().backward()
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])
    assert torch.equal(x.grad, seen[0])


def test_errors():
    with pytest.raises(ValueError, match="preserve_rng_state"):
        checkpoint(lambda t: t * 2, torch.ones(2, requires_grad=True), preserve_rng_state=False)
    with pytest.raises(errors.LockstepError, match="a tensor or a tuple"):
        checkpoint(lambda t: "text", torch.ones(2, requires_grad=True))
    with pytest.raises(errors.LockstepError, match="model failed"):
        checkpoint(lambda t: (_ for _ in ()).throw(KeyError("model failed")),
                   torch.ones(2, requires_grad=True))
    assert retained_state()["nodes"] == 0
