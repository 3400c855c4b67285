"""lockstep.rng in one process: the model-stream scope, named streams, the resume state and the
partition-invariant draws, each with its bad input."""

import pytest
import torch

import lockstep
from lockstep import errors, rng


def caller_draws(n=4):
    return torch.rand(n)


@pytest.fixture
def streams():
    torch.manual_seed(1234)
    return rng.RankStreams()


def test_scope_restores_the_caller_on_exit(streams):
    state = torch.get_rng_state()
    expected = caller_draws()
    torch.set_rng_state(state)
    with rng.model_stream(streams):
        inside = torch.rand(4)
    assert streams.caller_state_live and not streams.in_model_stream
    assert torch.equal(caller_draws(), expected)
    assert not torch.equal(inside, expected)


def test_scope_restores_the_caller_when_the_block_raises(streams):
    state = torch.get_rng_state()
    expected = caller_draws()
    torch.set_rng_state(state)
    with pytest.raises(KeyError):
        with rng.model_stream(streams):
            torch.rand(100)
            raise KeyError("model failed")
    assert not streams.in_model_stream
    assert torch.equal(caller_draws(), expected)


def test_nested_scopes_share_the_stream_and_it_advances():
    torch.manual_seed(7)
    a = rng.RankStreams()
    with rng.model_stream(a):
        first = torch.rand(3)
        with rng.model_stream(a):
            nested = torch.rand(3)
    with rng.model_stream(a):
        later = torch.rand(3)
    torch.manual_seed(7)
    b = rng.RankStreams()
    with rng.model_stream(b):
        flat = torch.rand(6)
        after = torch.rand(3)
    assert torch.equal(torch.cat([first, nested]), flat), "the nested scope continues the stream"
    assert torch.equal(later, after), "the next scope continues where the last one stopped"


def test_named_streams(streams):
    streams.add_named_stream("tensor-parallel", 99)
    assert streams.named_streams == ["tensor-parallel"]
    state = torch.get_rng_state()
    with rng.named_stream(streams, "tensor-parallel"):
        one = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), state)
    with rng.named_stream(streams, "tensor-parallel"):
        two = torch.rand(3)
    generator = torch.Generator().manual_seed(99)
    assert torch.equal(torch.cat([one, two]), torch.rand(6, generator=generator))
    with pytest.raises(errors.NotFoundError, match="no-such"):
        with rng.named_stream(streams, "no-such"):
            pass
    with pytest.raises(errors.AlreadyExistsError):
        streams.add_named_stream("tensor-parallel", 5)
    with pytest.raises(errors.AlreadyExistsError):
        streams.add_named_stream("other", 99)  # the seed is in use


def test_resume_state_round_trip(streams):
    streams.add_named_stream("data", 5)
    with rng.model_stream(streams):
        torch.rand(10)
    saved = rng.capture_resume_state(streams)
    assert isinstance(saved, bytes) and len(saved) > 0
    with rng.model_stream(streams):
        expected_model = torch.rand(5)
    expected_caller = torch.rand(5)
    rng.restore_resume_state(streams, saved)
    with rng.model_stream(streams):
        assert torch.equal(torch.rand(5), expected_model)
    assert torch.equal(torch.rand(5), expected_caller)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_damaged_resume_state_is_refused_and_changes_nothing(streams, damage):
    with rng.model_stream(streams):
        torch.rand(3)
    saved = rng.capture_resume_state(streams)
    if damage == "truncate":
        bad = saved[: len(saved) // 2]
    elif damage == "flip":
        middle = len(saved) // 2
        bad = saved[:middle] + bytes([saved[middle] ^ 0x40]) + saved[middle + 1:]
    else:
        bad = b""
    state = torch.get_rng_state()
    with pytest.raises((errors.DataLossError, errors.InvalidArgumentError)):
        rng.restore_resume_state(streams, bad)
    assert torch.equal(torch.get_rng_state(), state)
    assert rng.capture_resume_state(streams) == saved


def test_partitioned_uniform_is_the_slice_of_the_whole():
    whole = rng.partitioned_uniform(3, 1, 0, [6, 8], [(0, 6), (0, 8)])
    part = rng.partitioned_uniform(3, 1, 0, [6, 8], [(2, 5), (4, 8)])
    assert whole.dtype == torch.float32 and whole.shape == (6, 8)
    assert torch.equal(part, whole[2:5, 4:8])
    assert not torch.equal(whole, rng.partitioned_uniform(3, 1, 1, [6, 8], [(0, 6), (0, 8)]))
    with pytest.raises(ValueError, match="dimension 1"):
        rng.partitioned_uniform(3, 1, 0, [6, 8], [(0, 6), (4, 9)])


def test_partitioned_dropout_carries_its_gradient():
    # The gradient was silently lost: the result had no grad_fn.
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    args = dict(seed=5, stream=2, step=0, global_shape=[4, 6], box=[(0, 4), (3, 6)], p=0.5)
    y = rng.partitioned_dropout(x, **args)
    assert y.grad_fn is not None
    y.sum().backward()
    mask = rng.partitioned_dropout_mask(5, 2, 0, [4, 6], [(0, 4), (3, 6)], 0.5)
    assert torch.equal(x.grad, torch.where(mask, torch.full_like(x, 2.0), torch.zeros_like(x)))
    assert torch.autograd.gradcheck(lambda t: rng.partitioned_dropout(t, **args), (x,))
    assert torch.autograd.gradgradcheck(lambda t: rng.partitioned_dropout(t, **args), (x,))


def test_partitioned_dropout_matches_its_mask():
    x = torch.ones(4, 6)
    out = rng.partitioned_dropout(x[:, 3:].contiguous(), 5, 2, 0, [4, 6], [(0, 4), (3, 6)], 0.5)
    mask = rng.partitioned_dropout_mask(5, 2, 0, [4, 6], [(0, 4), (0, 6)], 0.5)
    assert torch.equal(out, mask[:, 3:].float() * 2.0)
    with pytest.raises(ValueError, match="p"):
        rng.partitioned_dropout_mask(5, 2, 0, [4, 6], [(0, 4), (0, 6)], 1.0)


def test_blocks_exited_out_of_order_raise_and_change_nothing(streams):
    # Note [Blocks exit in order]: leaving the outer block first left the caller's generator on
    # another stream's state, and raised nothing.
    streams.add_named_stream("noise", 11)
    before = torch.get_rng_state()
    outer, inner = rng.model_stream(streams), rng.named_stream(streams, "noise")
    outer.__enter__()
    inner.__enter__()
    torch.rand(3)
    with pytest.raises(errors.FailedPreconditionError, match="out of order"):
        outer.__exit__(None, None, None)
    assert streams.in_model_stream
    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    assert torch.equal(torch.get_rng_state(), before)
    with rng.model_stream(streams):  # the streams work on as before
        torch.rand(1)
    assert torch.equal(torch.get_rng_state(), before)


def test_synchronize_without_a_group_does_nothing(streams):
    state = torch.get_rng_state()
    rng.synchronize(None, streams)
    assert torch.equal(torch.get_rng_state(), state)


def test_wrong_types_raise_type_error(streams):
    with pytest.raises(TypeError):
        rng.model_stream("not streams").__enter__()
    with pytest.raises(TypeError):
        rng.restore_resume_state(streams, "text, not bytes")
    with pytest.raises(ValueError, match="None"):
        lockstep.distributed.communicator(None)


def test_none_for_streams_is_a_type_error_not_a_crash():
    # pybind11 passes None as an empty pointer; entering the block used to dereference it.
    with pytest.raises(TypeError, match="streams must be a lockstep.rng.RankStreams, not None"):
        rng.model_stream(None)
    with pytest.raises(TypeError, match="streams must be a lockstep.rng.RankStreams, not None"):
        rng.named_stream(None, "mask")


def test_errors_carry_their_code():
    error = errors.error_type("DEADLINE_EXCEEDED")("late", "DEADLINE_EXCEEDED")
    assert isinstance(error, RuntimeError) and error.code == "DEADLINE_EXCEEDED"
    assert issubclass(errors.error_type("INVALID_ARGUMENT"), ValueError)
