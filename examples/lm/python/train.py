"""examples/lm/python/train.py: the Python twin of examples/lm/train.cc — TinyLm (model.py)
trained through lockstep under DP x TP x CP from the torchrun environment.

    torchrun --nproc-per-node=4 train.py --cp=2 --steps=300 --log-csv=loss.csv
    (or: bazel-bin/tools/launch --nproc=4 -- python3 train.py --cp=2 ...)
    bazel-bin/tools/replay --out=/tmp/replay --nproc=4 --broken=rng,optimizer,data \
        -- python3 train.py --cp=2     (the state-replay protocol over this program)

The order in which a program meets lockstep's pieces, each marked below with "(n)":
  (1) the world from the torchrun environment (torch.distributed, Gloo) and the DP x TP x CP
      groups, made by every rank in the same order;
  (2) the rank's RNG streams (lockstep.rng.RankStreams), seeded like any PyTorch program;
  (3) the model, split over TP and CP (model.py), and AdamW;
  (4) TrainerRank with the model's forward, and optionally a restart from saved state;
  (5) per step: the DP-local batch, drawn from the data, never from the model stream;
  (6) the microbatch stream: each hand-back gives this replica the full outputs, and the
      caller's RNG agreeing across the TP x CP group;
  (7) the loss, from the planner's loss weights and a random token mask the caller draws;
  (8) backward, the gradient all-reduce over CP and DP, the optimizer step;
  (9) the loss log and save_state every N steps.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import lockstep
from lockstep import distributed, rng
from lockstep.trainer import TrainerRank

from model import Config, TinyLm

MASK_KEEP = 0.5  # the fraction of tokens the caller's random mask keeps in the loss
MASK64 = (1 << 64) - 1


def mix(x):
    """SplitMix64: a fixed function of the step and the index, not of any generator's state."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class Corpus:
    """Sequences of varied lengths cut from a text, a fixed function of (step, index)."""

    def __init__(self, path, max_length):
        self.data = open(path, "rb").read()
        self.max_length = max_length
        if len(self.data) < 4 * max_length:
            raise ValueError(f"corpus {path} has {len(self.data)} bytes; it needs at least "
                             f"{4 * max_length}")

    def global_batch(self, step, count):
        batch = []
        for i in range(count):
            h = mix(step * 7919 + i)
            length = 2 + h % (self.max_length - 1)
            # Every fourth step ends with two whole-budget sequences and two of one token, so
            # that CP ranks are left empty.
            if step % 4 == 3 and count >= 4 and i >= count - 4:
                length = self.max_length if i < count - 2 else 1
            start = (h >> 16) % (len(self.data) - length)
            batch.append((step * count + i, list(self.data[start:start + length])))
        return batch


def make_groups(tp, cp):
    """(1) Every group of the layout, made in the same order on every rank; this rank's."""
    topology = distributed.topology(dist.get_world_size(), tp, cp)
    rank = dist.get_rank()
    mine = {}
    for kind in ("tp_cp", "tp", "cp", "dp"):
        for ranks in topology.groups(kind):
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                mine[kind] = group
    return topology, mine


def token_mask(seed, step, ids, positions, max_positions):
    """(7) The caller's token mask: keyed by a seed the caller draws after a hand-back and each
    token's (sequence id, position), so every replica and layout masks the same tokens."""
    parts = []
    space = [(1 << 24) * max_positions]
    ids_list, positions_list = ids.tolist(), positions.tolist()
    t = 0
    while t < len(ids_list):
        end = t + 1
        while end < len(ids_list) and ids_list[end] == ids_list[t] and \
                positions_list[end] == positions_list[end - 1] + 1:
            end += 1
        first = ids_list[t] * max_positions + positions_list[t]
        parts.append(rng.partitioned_uniform(seed, 99, step, space, [(first, first + end - t)]))
        t = end
    return torch.cat(parts) < MASK_KEEP if parts else torch.zeros(0, dtype=torch.bool)


def all_reduce_gradients(parameters, group):
    """(8) Every parameter's gradient summed over `group` (one flattened all-reduce)."""
    if group is None:
        return
    flat = torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                      for p in parameters])
    distributed.all_reduce_sum(flat, group)
    at = 0
    for p in parameters:
        summed = flat[at:at + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = summed.clone()
        else:
            p.grad.copy_(summed)
        at += p.numel()


def saved_tensors(model, adam):
    """What save_state writes: the parameters and AdamW's state, in one transaction."""
    named = list(model.named_parameters())
    for name, p in model.named_parameters():
        state = adam.state[p]
        for field in ("step", "exp_avg", "exp_avg_sq"):
            named.append((f"optimizer/{name}/{field}", state[field]))
    return named


def start_adam_state(model, adam):
    """AdamW's state before a restart loads into it (the form AdamW's first step creates)."""
    for p in model.parameters():
        adam.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                         "exp_avg_sq": torch.zeros_like(p)}


def train(args):
    """The training run; torch.distributed is initialized. Returns the losses, by step."""
    topology, groups = make_groups(args.tp, args.cp)  # (1)
    rank = dist.get_rank()
    dp_rank, tp_rank, _ = topology.coordinates(rank)
    dp_size = topology.dp_size
    torch.manual_seed(args.seed)  # (2) every rank seeded alike, as a PyTorch program is
    streams = rng.RankStreams()
    config = Config()
    config.max_positions, config.seed = args.max_tokens, args.seed
    model = TinyLm(config, tp_rank, args.tp, groups["tp"], groups["cp"], "cpu")  # (3)
    parameters = list(model.parameters())
    adam = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=0.01)
    step = [0]
    trainer = TrainerRank(lambda work: model(work, step[0]), streams, groups["tp_cp"],  # (4)
                          tp=args.tp, cp=args.cp, max_tokens=args.max_tokens,
                          packing="in_order", loss_normalization="sum",
                          activation_checkpointing=True)
    first = 0
    data_position = 0  # batches consumed: the data cursor a resume must restore
    if args.resume_omit and not args.resume:
        raise ValueError("--resume_omit needs --resume")
    if args.resume:
        first = int(os.path.basename(args.resume.rstrip("/"))[len("step"):])
        data_position = 0 if args.resume_omit == "data" else first
        # The broken resume that omits the RNG puts back the streams this process had before.
        fresh_streams = rng.capture_resume_state(streams) if args.resume_omit == "rng" else None
        start_adam_state(model, adam)
        # Copies: load_state writes into the state tensors in place.
        fresh_adam = {p: {k: v.clone() for k, v in s.items()} for p, s in adam.state.items()}
        trainer.load_state(os.path.join(args.resume, f"rank{rank}"), saved_tensors(model, adam))
        if args.resume_omit == "optimizer":
            adam.state.clear()
            adam.state.update(fresh_adam)
        if fresh_streams is not None:
            rng.restore_resume_state(streams, fresh_streams)
    corpus = Corpus(args.corpus, args.max_tokens)
    leader = groups["tp_cp"] is None or dist.get_rank(groups["tp_cp"]) == 0
    losses, log = [], None
    if rank == 0 and args.log_csv:
        log = open(args.log_csv, "w")
        log.write("step,loss,tokens_per_s\n")
    since, tokens_since = time.monotonic(), 0
    for step[0] in range(first, args.steps):
        # (5) The DP-local batch, and the global count of targets the loss is divided by.
        global_batch = corpus.global_batch(data_position, args.sequences_per_step)
        data_position += 1
        global_targets = sum(len(tokens) - 1 for _, tokens in global_batch)
        tokens_since += sum(len(tokens) for _, tokens in global_batch)
        sequences = global_batch[dp_rank::dp_size]
        rows = torch.tensor([t for _, tokens in sequences for t in tokens])
        targets = torch.tensor([tokens[i + 1] if i + 1 < len(tokens) else 0
                                for _, tokens in sequences for i in range(len(tokens))])
        has_target = torch.tensor([i + 1 < len(tokens) for _, tokens in sequences
                                   for i in range(len(tokens))])
        ids = torch.tensor([sid for sid, tokens in sequences for _ in tokens])
        positions = torch.tensor([i for _, tokens in sequences for i in range(len(tokens))])
        adam.zero_grad(set_to_none=False)
        mask_seed = None
        if args.mask_before_hand_back:  # the negative control
            mask_seed = int(torch.randint(1 << 62, (1,)))
        step_loss = torch.zeros((), dtype=torch.float64)
        last = None
        # (6) The microbatch stream.
        for out in trainer.forward_microbatches(rows, [len(t) for _, t in sequences],
                                                ids=[sid for sid, _ in sequences]):
            # Right after a hand-back every replica's RNG agrees: draw the mask's seed now.
            if mask_seed is None:
                mask_seed = int(torch.randint(1 << 62, (1,)))
            r = out.input_rows
            keep = token_mask(mask_seed, step[0], ids[r], positions[r], args.max_tokens)
            # (7) Next-token cross-entropy weighted by the planner's loss weights, the mask and
            # whether there is a next token; divided by the global batch's expected count of
            # kept tokens, the same in every layout.
            weight = out.loss_weights * has_target[r] * keep / (MASK_KEEP * global_targets)
            nll = torch.nn.functional.cross_entropy(out.outputs, targets[r], reduction="none")
            loss = (nll.double() * weight).sum()
            loss.backward()  # (8) each replica's gradient reaches its own rows only
            step_loss += loss.detach()
            last = out.outputs.detach()
        if leader and last is not None and last.shape[0] > 0:
            torch.multinomial(torch.softmax(last[-1].float(), 0), 1)  # the leader's sample
        # (8) Over CP (each CP rank back-propagated its own tokens), then over DP. TP ranks hold
        # the same gradient for the replicated parameters (copy_to_group's backward summed it)
        # and their own shard's for the split ones.
        all_reduce_gradients(parameters, groups["cp"])
        all_reduce_gradients(parameters, groups["dp"])
        distributed.all_reduce_sum(step_loss, groups["dp"])
        adam.step()
        losses.append(float(step_loss))
        done = step[0] + 1
        if args.capture_dir:  # the state-replay protocol (tools/replay)
            lockstep.replay.capture_state(
                args.capture_dir, done, model=model, optimizer=adam, streams=streams,
                data_position=data_position,
                absent={"ledger": "this example keeps no recovery ledger",
                        "python_random": "this example draws nothing from Python's random",
                        "numpy_random": "this example does not use NumPy"})
        if log is not None:
            seconds = time.monotonic() - since
            log.write(f"{done},{float(step_loss)!r},{tokens_since / max(seconds, 1e-9):.0f}\n")
            log.flush()
        if rank == 0 and done % args.log_every == 0:
            print(f"[rank 0] step {done} loss {float(step_loss):.4f} tokens/s "
                  f"{tokens_since / (time.monotonic() - since):.0f}", flush=True)
            since, tokens_since = time.monotonic(), 0
        if args.save_every and done % args.save_every == 0 and args.save_dir:  # (9)
            path = os.path.join(args.save_dir, f"step{done}")
            os.makedirs(path, exist_ok=True)
            trainer.save_state(os.path.join(path, f"rank{rank}"), saved_tensors(model, adam))
    if log is not None:
        log.close()
    return losses, [p.detach().clone() for p in parameters]


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sequences-per-step", "--sequences_per_step", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", default="/usr/share/common-licenses/GPL-3")
    parser.add_argument("--log-every", "--log_every", type=int, default=20)
    parser.add_argument("--log-csv", default="")
    # The state-replay protocol's flags (tools/replay) are spelt with underscores.
    parser.add_argument("--save-every", "--save_every", type=int, default=0)
    parser.add_argument("--save-dir", "--save_dir", default="")
    parser.add_argument("--resume", default="")
    parser.add_argument("--resume_omit", "--resume-omit", default="",
                        choices=["", "rng", "optimizer", "data"],
                        help="a broken resume for tools/replay: leave this part unrestored")
    parser.add_argument("--capture_dir", "--capture-dir", default="",
                        help="capture every rank's state after each step (lockstep.replay)")
    parser.add_argument("--mask-before-hand-back", action="store_true",
                        help="negative control: draw the mask's seed before the hand-back")
    return parser.parse_args(argv)


if __name__ == "__main__":
    dist.init_process_group("gloo")  # the torchrun environment: MASTER_ADDR, RANK, ...
    train(parse())
    dist.barrier()
    dist.destroy_process_group()
