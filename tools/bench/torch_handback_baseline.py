#!/usr/bin/env python3
"""The PyTorch baseline of a hand-back point, as ART's TrainerRank does it.

Run under torchrun, one process per GPU (the group is all of them):
  python3 -m torch.distributed.run --nproc_per_node=N tools/bench/torch_handback_baseline.py

Per hand-back: enter and exit a model RNG context (get the CPU and CUDA default generator states,
install the model's, run nothing, save the model's advanced states, put the caller's back), then
one NCCL broadcast of both caller states from the group's leader, staged through the GPU (a CUDA
byte tensor), installed on the other ranks. Also times a bare broadcast of the same bytes.
Prints medians of --iterations after --warmup, and TORCH_HANDBACK_US=<median> for handback.sh.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    if args.iterations < 10:
        raise SystemExit("--iterations must be >= 10")

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    torch.manual_seed(100 + rank)

    # The model's own RNG states, persisted across hand-backs.
    model_cpu = torch.Generator().manual_seed(7).get_state()
    torch.cuda.manual_seed(7)
    model_cuda = torch.cuda.get_rng_state()
    torch.manual_seed(100 + rank)
    torch.cuda.manual_seed(100 + rank)

    cpu_bytes = torch.get_rng_state().numel()
    cuda_bytes = torch.cuda.get_rng_state().numel()
    wire_bytes = cpu_bytes + cuda_bytes
    bare = torch.zeros(wire_bytes, dtype=torch.uint8, device=device)

    def handback():
        nonlocal model_cpu, model_cuda
        # Enter the model RNG context.
        caller_cpu = torch.get_rng_state()
        caller_cuda = torch.cuda.get_rng_state()
        torch.set_rng_state(model_cpu)
        torch.cuda.set_rng_state(model_cuda)
        # (model work would run here)
        model_cpu = torch.get_rng_state()
        model_cuda = torch.cuda.get_rng_state()
        torch.set_rng_state(caller_cpu)
        torch.cuda.set_rng_state(caller_cuda)
        # Synchronize the caller's states from the leader, staged through the GPU.
        if rank == 0:
            wire = torch.cat([caller_cpu, caller_cuda]).to(device)
        else:
            wire = torch.empty(wire_bytes, dtype=torch.uint8, device=device)
        dist.broadcast(wire, src=0)
        if rank != 0:
            host = wire.cpu()
            torch.set_rng_state(host[:cpu_bytes])
            torch.cuda.set_rng_state(host[cpu_bytes:])
        else:
            torch.cuda.current_stream().synchronize()

    def bare_broadcast():
        dist.broadcast(bare, src=0)
        torch.cuda.current_stream().synchronize()

    samples = {"handback": [], "bare_broadcast": []}
    for i in range(args.warmup + args.iterations):
        for name, op in (("bare_broadcast", bare_broadcast), ("handback", handback)):
            start = time.perf_counter()
            op()
            elapsed = (time.perf_counter() - start) * 1e6
            if i >= args.warmup:
                samples[name].append(elapsed)

    # The synchronized caller states agree across ranks.
    draws = torch.cat([torch.rand(8), torch.rand(8, device=device).cpu()]).to(device)
    gathered = [torch.empty_like(draws) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, draws)
    if any(not torch.equal(g, draws) for g in gathered):
        raise SystemExit("baseline: after the broadcast the ranks draw different numbers")

    if rank == 0:
        median = {k: statistics.median(v) for k, v in samples.items()}
        print(f"PyTorch baseline: {dist.get_world_size()} GPUs, {wire_bytes}-byte states, "
              f"{args.iterations} iterations after {args.warmup} warm-up, medians:")
        for name, value in median.items():
            print(f"  {name:14s} {value:8.1f} us")
        print(f"TORCH_HANDBACK_US={median['handback']:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
