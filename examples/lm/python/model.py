"""TinyLm in Python: the twin of examples/lm/model.h, a small decoder-only transformer language
model over bytes, split over tensor parallelism (TP) and context parallelism (CP) the way a
lockstep user writes one in plain PyTorch modules.

- Embeddings, norms and attention are whole on every rank; the MLP is split over TP (its first
  layer by rows, its second by columns) with lockstep.distributed.copy_to_group before and
  reduce_from_group after, as in Megatron.
- Attention runs on this CP rank's shard (the trainer's ShardWork): its queries are the shard's
  tokens, its keys and values every CP rank's (lockstep.distributed.gather_rows), masked causally
  by each token's sequence and position, so a sequence split over CP ranks attends as unsplit.
- MLP dropout is partition-invariant (lockstep.rng.partitioned_dropout_mask keyed by the token's
  sequence id and position and the hidden unit): every layout trains the same model.
- Each block runs through work.run_block: with activation checkpointing its activations are
  recomputed in backward with the forward's randomness.

The weights come from the model's own seeded generator, whole, and each rank keeps its TP shard,
so every layout starts from the same model and the caller's RNG does not move.
"""

import math

import torch

from lockstep import distributed, rng

SEQUENCE_IDS = 1 << 24  # the dropout's index space: sequence ids below this


class Config:
    vocab = 256
    width = 32
    heads = 2
    hidden = 64
    blocks = 2
    max_positions = 64
    dropout = 0.1
    seed = 1


def _runs(ids, positions):
    """(begin, end) of each run of consecutive positions of one sequence."""
    runs, t, n = [], 0, len(ids)
    while t < n:
        end = t + 1
        while end < n and ids[end] == ids[t] and positions[end] == positions[end - 1] + 1:
            end += 1
        runs.append((t, end))
        t = end
    return runs


def dropout_mask(seed, block, step, ids, positions, max_positions, hidden, begin, end, p, device):
    """Keep-mask of hidden units [begin, end) for the tokens (sequence ids, positions)."""
    masks = []
    ids_list, positions_list = ids.tolist(), positions.tolist()
    for t, run_end in _runs(ids_list, positions_list):
        row = ids_list[t] * max_positions + positions_list[t]
        masks.append(rng.partitioned_dropout_mask(
            seed, block, step, [SEQUENCE_IDS * max_positions, hidden],
            [(row, row + run_end - t), (begin, end)], p, device))
    if not masks:
        return torch.zeros(0, end - begin, dtype=torch.bool, device=device)
    return torch.cat(masks)


class TinyLm(torch.nn.Module):
    def __init__(self, config, tp_rank, tp_size, tp_group, cp_group, device):
        super().__init__()
        if config.hidden % tp_size:
            raise ValueError(f"TP size {tp_size} does not split {config.hidden} hidden units")
        self.config, self.tp_rank, self.tp_size = config, tp_rank, tp_size
        self.tp_group, self.cp_group = tp_group, cp_group
        generator = torch.Generator().manual_seed(config.seed)

        def draw(shape, scale):
            return torch.randn(shape, generator=generator) * scale

        def param(t):
            return torch.nn.Parameter(t.to(device))

        scale = 1 / math.sqrt(config.width)
        self.token_embedding = param(draw([config.vocab, config.width], 0.5))
        self.position_embedding = param(draw([config.max_positions, config.width], 0.1))
        shard = config.hidden // tp_size
        begin = tp_rank * shard
        self.blocks = torch.nn.ModuleList()
        for _ in range(config.blocks):
            b = torch.nn.Module()
            b.norm1 = torch.nn.LayerNorm(config.width).to(device)
            for name in ("wq", "wk", "wv", "wo"):
                setattr(b, name, param(draw([config.width, config.width], scale)))
            b.norm2 = torch.nn.LayerNorm(config.width).to(device)
            w1 = draw([config.hidden, config.width], scale)
            w2 = draw([config.width, config.hidden], 1 / math.sqrt(config.hidden))
            b.w1 = param(w1[begin:begin + shard].contiguous())   # split over TP
            b.w2 = param(w2[:, begin:begin + shard].contiguous())
            self.blocks.append(b)
        self.norm = torch.nn.LayerNorm(config.width).to(device)

    @staticmethod
    def split_over_tp(name):
        return name.endswith(".w1") or name.endswith(".w2")

    def forward(self, work, step):
        """Logits [n, vocab] of the shard's n tokens (work.inputs: token ids) at `step`."""
        c = self.config
        device = self.token_embedding.device
        # Read from `work` now: it is gone when the blocks are recomputed in backward.
        cpu_positions, ids = work.positions, work.sequence_ids
        positions = cpu_positions.to(device)
        x = self.token_embedding[work.inputs.to(device)] + self.position_embedding[positions]
        query_meta = torch.stack([ids.to(device), positions], 1)
        key_meta = query_meta
        widest = work.widest_shard
        if self.cp_group is not None:
            padded = torch.full((widest, 2), -1, dtype=query_meta.dtype, device=device)
            padded[:query_meta.shape[0]] = query_meta
            key_meta = torch.cat(distributed.all_gather(padded, self.cp_group))
        heads, head_width = c.heads, c.width // c.heads
        shard = c.hidden // self.tp_size
        begin = self.tp_rank * shard
        visible = (query_meta[:, 0:1] == key_meta[:, 0][None, :]) & \
            (key_meta[:, 1][None, :] <= query_meta[:, 1:2])
        # The blocks capture values only: under checkpointing they run again in backward.
        for index, b in enumerate(self.blocks):
            def block(inputs, b=b, index=index):
                h = inputs[0]
                n = h.shape[0]
                a = b.norm1(h)
                q = a @ b.wq.t()
                k = distributed.gather_rows(a @ b.wk.t(), widest, self.cp_group)
                v = distributed.gather_rows(a @ b.wv.t(), widest, self.cp_group)
                m = k.shape[0]
                qh = q.view(n, heads, head_width).transpose(0, 1)
                kh = k.view(m, heads, head_width).transpose(0, 1)
                vh = v.view(m, heads, head_width).transpose(0, 1)
                scores = (qh @ kh.transpose(1, 2) / math.sqrt(head_width)).masked_fill(
                    ~visible[None], float("-inf"))
                attended = (torch.softmax(scores, 2) @ vh).transpose(0, 1).reshape(n, c.width)
                after = h + attended @ b.wo.t()
                m_in = distributed.copy_to_group(b.norm2(after), self.tp_group)
                units = torch.nn.functional.gelu(m_in @ b.w1.t())
                keep = dropout_mask(c.seed, index, step, ids, cpu_positions, c.max_positions,
                                    c.hidden, begin, begin + shard, c.dropout, h.device)
                partial = (units * keep.to(units.dtype) / (1 - c.dropout)) @ b.w2.t()
                return [after + distributed.reduce_from_group(partial, self.tp_group)]
            x = work.run_block(block, [x])[0]
        return self.norm(x) @ self.token_embedding.t()
