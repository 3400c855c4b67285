"""lockstep from Python on a GPU: the model-stream scope and checkpoint with CUDA generators, and
synchronize over Gloo between processes sharing the GPU, and over NCCL (a group of one here;
across GPUs where there are two or more). Skipped where there is no CUDA."""

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint

from lockstep import distributed, rng
from lockstep.checkpoint import checkpoint, retained_state

from distributed_util import groups_of, run_world

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


def test_scope_restores_the_cuda_generator_also_on_an_exception():
    torch.manual_seed(5)
    streams = rng.RankStreams(cuda_device=0)
    state = torch.cuda.get_rng_state()
    expected = torch.rand(8, device="cuda")
    torch.cuda.set_rng_state(state)
    with pytest.raises(KeyError):
        with rng.model_stream(streams):
            inside = torch.rand(8, device="cuda")
            raise KeyError("model failed")
    assert torch.equal(torch.rand(8, device="cuda"), expected)
    assert not torch.equal(inside, expected)


def test_checkpoint_with_cuda_dropout_is_bitwise_torch_utils_checkpoint():
    def run(ours):
        torch.manual_seed(0)
        layer = torch.nn.Linear(32, 32).cuda()
        x = torch.randn(16, 32, device="cuda", requires_grad=True)
        torch.manual_seed(7)
        block = lambda t: torch.nn.functional.dropout(torch.relu(layer(t)), 0.4, True)  # noqa
        out = checkpoint(block, x) if ours else torch.utils.checkpoint.checkpoint(
            block, x, use_reentrant=True)
        torch.rand(3, device="cuda")  # the caller draws before backward
        out.square().sum().backward()
        return out.detach(), x.grad, layer.weight.grad, torch.cuda.get_rng_state()
    ours, theirs = run(True), run(False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert retained_state()["nodes"] == 0


def _synchronized_cuda_draws(rank, world_size):
    torch.cuda.set_device(0)
    group = groups_of(world_size, 2)
    torch.manual_seed(rank)  # the replicas start apart
    streams = rng.RankStreams(cuda_device=0)
    rng.synchronize(group, streams)
    with rng.model_stream(streams):
        model = torch.rand(4, device="cuda").tolist()
    if dist.get_rank(group) == 0:
        torch.rand(11, device="cuda")
    rng.synchronize(group, streams)
    return {"model": model, "caller": torch.rand(4, device="cuda").tolist(),
            "cpu": torch.rand(4).tolist()}


def test_synchronize_makes_cuda_and_cpu_draws_agree_over_gloo():
    results = run_world(2, _synchronized_cuda_draws, start_method="spawn")
    assert results[0] == results[1]


def _nccl_draws(rank, world_size, backend="nccl"):
    torch.cuda.set_device(rank)  # one GPU per rank: NCCL refuses two ranks on one GPU
    group = dist.new_group(list(range(world_size)), backend=backend)
    torch.manual_seed(rank)  # the replicas start apart
    streams = rng.RankStreams(cuda_device=rank)
    rng.synchronize(group, streams)  # the states, CPU tensors, staged through the GPU
    with rng.model_stream(streams):
        model = torch.rand(4, device="cuda").tolist()
    if dist.get_rank(group) == 0:
        torch.rand(11, device="cuda")
    rng.synchronize(group, streams)
    total = distributed.all_reduce_sum(torch.full((3,), rank + 1.0), group)  # a CPU tensor
    gathered = distributed.all_gather(torch.full((2,), float(rank), device="cuda"), group)
    return {"model": model, "caller": torch.rand(4, device="cuda").tolist(),
            "cpu": torch.rand(4).tolist(), "sum": total.tolist(),
            "gathered": [g.cpu().tolist() for g in gathered], "lane": distributed.has_host_lane(group)}


def _check_nccl(results, world_size):
    expected_sum = [float(sum(range(1, world_size + 1)))] * 3
    for r in results:
        assert r["caller"] == results[0]["caller"] and r["cpu"] == results[0]["cpu"]
        assert r["model"] == results[0]["model"]
        assert r["sum"] == expected_sum
        assert r["gathered"] == [[float(m)] * 2 for m in range(world_size)]


def _plain_draws(rank, world_size):
    """What the caller of _nccl_draws draws at world 1, in plain PyTorch: a group of one has no one
    to agree with, so synchronizing must not move the caller, nor model work."""
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    torch.rand(11, device="cuda")  # the leader's own draw
    return {"caller": torch.rand(4, device="cuda").tolist(), "cpu": torch.rand(4).tolist()}


def test_an_nccl_group_of_one_adopts_and_stages_cpu_tensors_through_the_gpu():
    # The one-GPU machine's share of the NCCL path: adoption, the staged CPU states, the in-step
    # exchange on the device (a group of one has no host lane). Its results are compared with
    # values made without NCCL: plain PyTorch for the caller's draws, a Gloo group of one for the
    # model stream's (staging through the GPU must change nothing).
    nccl = run_world(1, _nccl_draws, start_method="spawn")[0]
    gloo = run_world(1, _nccl_draws, "gloo", start_method="spawn")[0]
    plain = run_world(1, _plain_draws, start_method="spawn")[0]
    assert nccl["caller"] == plain["caller"] and nccl["cpu"] == plain["cpu"], (nccl, plain)
    for key in ("model", "caller", "cpu", "sum", "gathered"):
        assert nccl[key] == gloo[key], (key, nccl[key], gloo[key])
    _check_nccl([nccl], 1)
    assert nccl["lane"] is False


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"NCCL across GPUs needs 2 GPUs; {torch.cuda.device_count()} here")
def test_synchronize_over_nccl_across_gpus_makes_draws_agree():
    world = torch.cuda.device_count()
    results = run_world(world, _nccl_draws, start_method="spawn")
    _check_nccl(results, world)
    assert all(r["lane"] for r in results)  # one host: the states take the host lane
