"""Starts a world of processes on 127.0.0.1 under torch.distributed with Gloo, runs a function on
every rank, and returns what each returned (or raises with every failing rank's traceback)."""

import multiprocessing
import os
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist


def _rank_main(rank, world_size, init_method, fn, args, results):
    try:
        # The ranks share the machine's cores: one thread pool each of all of them would thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: B902 (every failure goes back to the test)
        results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()  # the result is written before the process ends
        os._exit(0)  # skip interpreter teardown: a peer's group may be half destroyed


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world_size, fn, *args, timeout=120, start_method=None, store="file"):
    """``fn(rank, world_size, *args)`` on each of ``world_size`` ranks (module-level ``fn``).
    ``fn`` returns plain values (lists, not tensors: those would cross through shared memory).
    ``store``: "file" (a FileStore in a temporary folder) or "tcp" (rank 0 serves a TCPStore on
    127.0.0.1, as torchrun's ranks meet).
    Ranks are forked, except where CUDA is present: there they are spawned, since a forked child
    can use neither CUDA nor autograd once the parent has (torch starts device threads)."""
    if start_method is None:
        start_method = "spawn" if torch.cuda.is_available() else "fork"
    context = multiprocessing.get_context(start_method)
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = (f"tcp://127.0.0.1:{_free_port()}" if store == "tcp"
                else f"file://{os.path.join(tmp, 'store')}")
        procs = [context.Process(target=_rank_main, args=(r, world_size, init, fn, args, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in range(world_size):
                rank, kind, value = results.get(timeout=timeout)
                got[rank] = (kind, value)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    failures = [f"rank {r}:\n{v}" for r, (k, v) in sorted(got.items()) if k == "error"]
    if failures:
        raise AssertionError("\n".join(failures))
    return [got[r][1] for r in range(world_size)]


def groups_of(world_size, cp, tp=1):
    """Every rank's TP x CP group (ranks [g * tp * cp, (g + 1) * tp * cp)), made by every rank in
    the same order as torch.distributed requires; returns this rank's group."""
    size = tp * cp
    mine = None
    for g in range(world_size // size):
        ranks = list(range(g * size, (g + 1) * size))
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine
