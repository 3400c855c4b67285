"""examples/lora/train.py: a Qwen-shaped LoRA fine-tuning program (model.py) that asks lockstep
the question of two matched actors: do two processes that load the same state compute the same
bits, and if not, where do they first differ?

    python3 -m lockstep.verify --out=/tmp/verify --nproc=2 -- python3 train.py --layers=2
    python3 -m lockstep.verify --out=/tmp/planted --nproc=2 -- python3 train.py --plant=layers.1.mlp
    torchrun --nproc-per-node=2 train.py --steps=20       (plain training, no verification)

What it does, in order, each marked "(n)" below:
  (1) deterministic mode first, before any CUDA work (--deterministic, the default);
  (2) torch.distributed from the torchrun environment (Gloo on the CPU, NCCL on a GPU);
  (3) the model's initial state: made from --seed and saved as safetensors (--init) by rank 0
      the first time, loaded from that file by every rank after (frozen base weights, rank-1
      LoRA adapters on every projection);
  (4) AdamW over the adapters, and --warm_steps of training so the saved state has an optimizer
      state (as a checkpoint taken mid-run has);
  (5) the step under test: --microbatches backward passes over this rank's fixed batch,
      gradients accumulating, no optimizer update;
  (6) lockstep.verify.program: under python3 -m lockstep.verify, save the state or run an
      actor (repeatability cold/warm1/warm2, recorded modules and operators); otherwise train.
--plant=MODULE adds a nondeterministic residue to that module's output (lockstep.controls): the
negative control the verification must name, down to the operator and the module.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import lockstep
import lockstep.verify
from lockstep import numerics

from model import Config, QwenLora, fixed_batch, lora_parameters, loss_fn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=160)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--init", default="",
                        help="the initial weights as safetensors (made from --seed if missing)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=3, help="backwards per step")
    parser.add_argument("--warm_steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="plain training steps after")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--plant", default="", help="negative control: a nondeterministic module")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    for name in ("layers", "batch", "seq", "microbatches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    return args


def initial_state(args, config, device, rank):
    """(3) The model from the saved initial weights; rank 0 makes and saves them the first time."""
    model = QwenLora(config, device=device)
    if not args.init:
        return model
    if rank == 0 and not os.path.exists(args.init):
        numerics.write_safetensors(args.init, model.state_dict(),
                                   {"seed": str(args.seed), "layers": str(args.layers)})
    if dist.is_initialized():
        dist.barrier()
    tensors, _ = numerics.read_safetensors(args.init)
    model.load_state_dict(dict(tensors), strict=True)
    return model


def main(argv=None):
    args = parse(argv)
    if args.deterministic:
        lockstep.determinism.enforce()  # (1)
    if "WORLD_SIZE" in os.environ:  # (2)
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device(args.device, torch.cuda.current_device()) \
        if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(args.seed)
    streams = lockstep.rng.RankStreams(device.index if device.type == "cuda" else -1)
    config = Config(layers=args.layers, hidden=args.hidden, heads=args.heads,
                    kv_heads=args.kv_heads, intermediate=args.intermediate, seed=args.seed,
                    dtype=DTYPES[args.dtype])
    model = initial_state(args, config, device, rank)
    if args.plant:
        model.plant(args.plant, lockstep.controls.nondeterministic_residue)
    adapters = [p for _, p in lora_parameters(model)]
    optimizer = torch.optim.AdamW(adapters, lr=args.lr)  # (4)
    batches = [(ids.to(device), targets.to(device)) for ids, targets in
               fixed_batch(config, args.batch, args.seq, args.seed + 1 + rank, args.microbatches)]

    def step():  # (5)
        total = torch.zeros((), dtype=torch.float32, device=device)
        for ids, targets in batches:
            loss = loss_fn(model(ids), targets) / len(batches)
            loss.backward()
            total += loss.detach()
        return {"loss": total}

    def train(steps):
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            step()
            for p in adapters:
                if dist.is_initialized() and dist.get_world_size() > 1:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train(args.warm_steps)
    caller = {"seed": args.seed, "layers": args.layers, "dtype": args.dtype,
              "plant": args.plant or "none"}
    if not lockstep.verify.program(step, model, optimizer, streams=streams, caller=caller):  # (6)
        train(args.steps)
        if rank == 0:
            print(f"trained {args.warm_steps + args.steps} steps; loss {float(step()['loss']):.4f}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
