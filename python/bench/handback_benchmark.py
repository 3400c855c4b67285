"""The hand-back from Python: lockstep against the same steps written in plain PyTorch, paired.

One hand-back is what a trainer does around each microbatch's model work: run a small model
draw on a private stream, give the caller's state back, and make the caller's state agree across
the TP x CP group. lockstep: ``with rng.model_stream(streams): draw`` then
``rng.synchronize(group, streams)``. Plain PyTorch, as ART does it: get_rng_state (CPU, and CUDA
where present), set the model's state, draw, save it, set the caller's back, then one
torch.distributed.broadcast of both states from the leader and set_rng_state on every member.
Both run in one loop, alternating, after a warm-up; each rank reports its medians and rank 0
prints the ratio. With CUDA the time is the host's, as a trainer pays it: the device is idle when
each timed hand-back starts and is not waited for inside it (the model draw's kernel runs
asynchronously on either side; processes sharing one GPU would otherwise time the GPU's switching
between them). Also the binding's own cost: one model-stream scope entered and exited from
Python against the same from C++, in the same process.

    python3 handback_benchmark.py [--world 2] [--iterations 2000] [--device cpu|cuda]

Exits non-zero when it cannot measure (a rank failed, a median is zero).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def plain_handback(model_state, group, leader, cuda):
    caller_cpu = torch.get_rng_state()
    caller_cuda = torch.cuda.get_rng_state() if cuda else None
    torch.set_rng_state(model_state[0])
    if cuda:
        torch.cuda.set_rng_state(model_state[1])
    torch.rand(64, device="cuda" if cuda else "cpu")  # the model's draw
    model_state[0] = torch.get_rng_state()
    if cuda:
        model_state[1] = torch.cuda.get_rng_state()
    torch.set_rng_state(caller_cpu)
    if cuda:
        torch.cuda.set_rng_state(caller_cuda)
    states = [torch.get_rng_state()] + ([torch.cuda.get_rng_state()] if cuda else [])
    both = torch.cat(states)
    dist.broadcast(both, src=leader, group=group)
    torch.set_rng_state(both[:states[0].numel()].clone())
    if cuda:
        torch.cuda.set_rng_state(both[states[0].numel():].clone())


def lockstep_handback(rng, streams, group, cuda):
    with rng.model_stream(streams):
        torch.rand(64, device="cuda" if cuda else "cpu")
    rng.synchronize(group, streams)


def worker(rank, world, store, iterations, device, results):
    from lockstep import rng
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(0)  # every process shares the one GPU over Gloo
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    streams = rng.RankStreams(cuda_device=0 if cuda else -1)
    gen = torch.Generator().manual_seed(9)
    model_state = [gen.get_state()] + ([torch.cuda.get_rng_state()] if cuda else [])
    ours, theirs = [], []
    for i in range(iterations + 200):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            if cuda:
                torch.cuda.synchronize()  # the device idle, outside the timed region
            start = time.perf_counter_ns()
            if which == 0:
                lockstep_handback(rng, streams, group, cuda)
            else:
                plain_handback(model_state, group, 0, cuda)
            elapsed = time.perf_counter_ns() - start
            if i >= 200:  # warm-up outside the timed region
                (ours if which == 0 else theirs).append(elapsed)
    python_scope = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        with rng.model_stream(streams):
            pass
        python_scope.append(time.perf_counter_ns() - start)
    from lockstep import _C
    cpp_scope = _C._time_model_stream_scope_ns(streams, iterations)
    results.put((rank, statistics.median(ours), statistics.median(theirs),
                 statistics.median(python_scope), cpp_scope))
    dist.barrier()
    results.close()
    results.join_thread()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device=cuda: no CUDA device here; cannot measure")
    context = mp.get_context("fork" if args.device == "cpu" else "spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=worker, args=(r, args.world, os.path.join(tmp, "store"),
                                                      args.iterations, args.device, results))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        got = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=30)
    if any(p.exitcode != 0 for p in procs) or len(got) != args.world:
        sys.exit("a rank failed; cannot measure")
    got.sort()
    ours = max(g[1] for g in got)  # the slowest rank bounds the step
    theirs = max(g[2] for g in got)
    if ours <= 0 or theirs <= 0:
        sys.exit("a median is zero; cannot measure")
    py_scope, cpp_scope = got[0][3], got[0][4]
    print(f"hand-back ({args.device}, world {args.world}, {args.iterations} paired iterations): "
          f"lockstep {ours / 1e3:.1f} us, plain PyTorch {theirs / 1e3:.1f} us, "
          f"ratio {ours / theirs:.2f}x (target <= 0.5x)")
    print(f"binding overhead: a model-stream scope from Python {py_scope / 1e3:.2f} us, from C++ "
          f"{cpp_scope / 1e3:.2f} us, difference {(py_scope - cpp_scope) / 1e3:.2f} us "
          f"(target < 5 us)")


if __name__ == "__main__":
    main()
