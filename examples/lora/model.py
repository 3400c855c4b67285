"""A small Qwen2-shaped decoder-only language model with rank-1 LoRA adapters, in plain PyTorch.

It exists for determinism checks: every bit of its initial state is a function of Config.seed,
its attention is written out (no fused SDPA kernel picks an algorithm for us), and a fault can be
planted at any named module to see whether a checker finds it. Module names match Qwen2's
(``layers.0.self_attn.q_proj``, ``layers.1.mlp``, ...). Runs on torch 1.13 and 2.x.

    import torch
    from model import Config, QwenLora, fixed_batch, lora_parameters, loss_fn

    config = Config(layers=2, dtype=torch.float32)
    model = QwenLora(config, device="cpu")  # or "cuda"; same seed, same initial bits
    for ids, targets in fixed_batch(config, batch=2, seq=16, seed=7, microbatches=3):
        loss_fn(model(ids), targets).backward()  # gradients accumulate over the microbatches
    grads = {name: p.grad for name, p in lora_parameters(model)}
    model.plant("layers.0.mlp", lambda out: 1e-3 * torch.ones_like(out))  # a planted fault
    model.unplant()
"""
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    """Sizes and seed of the model; checked on construction."""

    vocab: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 160
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    lora_rank: int = 1
    lora_alpha: float = 2.0
    seed: int = 1234
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate",
                     "lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Config.{name}={value!r}: must be an integer >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"Config.hidden={self.hidden}: must be a multiple of "
                             f"heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"Config.heads={self.heads}: must be a multiple of kv_heads="
                             f"{self.kv_heads}")
        if self.head_dim % 2:  # rotary embedding turns pairs of channels
            raise ValueError(f"Config.hidden // heads = {self.head_dim}: must be even")
        for name in ("rope_theta", "rms_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Config.{name}={getattr(self, name)!r}: must be > 0")
        if not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise ValueError(f"Config.dtype={self.dtype!r}: must be a floating-point torch.dtype")

    @property
    def head_dim(self):
        """Width of one attention head."""
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    """Root-mean-square norm; reduces in float32 whatever the input dtype, like Qwen2."""

    def __init__(self, size, eps, factory):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary(x, positions, theta):
    """Applies rotary position embedding to x [batch, heads, seq, head_dim] at int64 positions
    [batch, seq]; computed in float32 and cast back to x's dtype."""
    dim = x.shape[-1]
    # Computed on the fly, not a buffer: nothing derived from the config lands in state_dict.
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    freqs = positions.to(x.device, torch.float32)[..., None] * inv_freq  # [batch, seq, dim/2]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]  # [batch, 1, seq, dim]
    h = x.float()
    half = torch.cat((-h[..., dim // 2:], h[..., :dim // 2]), dim=-1)
    return (h * angles.cos() + half * angles.sin()).to(x.dtype)


class LoraLinear(nn.Module):
    """A frozen nn.Linear (``base``) plus a trainable low-rank update B @ A scaled by alpha/rank."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.zeros(rank, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def _lora(config, fan_in, fan_out, bias, factory):
    # skip_init: the weights are overwritten by QwenLora's seeded init, so don't spend (or
    # advance) the caller's global RNG on nn.Linear's default init.
    base = nn.utils.skip_init(nn.Linear, fan_in, fan_out, bias=bias, **factory)
    return LoraLinear(base, config.lora_rank, config.lora_alpha)


class Attention(nn.Module):
    """Causal grouped-query self-attention, written out as matmul, mask, softmax, matmul."""

    def __init__(self, config, factory):
        super().__init__()
        self.config = config
        kv = config.kv_heads * config.head_dim
        self.q_proj = _lora(config, config.hidden, config.hidden, True, factory)
        self.k_proj = _lora(config, config.hidden, kv, True, factory)
        self.v_proj = _lora(config, config.hidden, kv, True, factory)
        self.o_proj = _lora(config, config.hidden, config.hidden, False, factory)

    def forward(self, x, positions):
        c = self.config
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotary(q, positions, c.rope_theta), rotary(k, positions, c.rope_theta)
        # GQA: each kv head serves heads // kv_heads consecutive query heads, as Qwen2's repeat_kv.
        k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
        v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(c.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1).to(v.dtype)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, c.hidden))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config, factory):
        super().__init__()
        self.gate_proj = _lora(config, config.hidden, config.intermediate, False, factory)
        self.up_proj = _lora(config, config.hidden, config.intermediate, False, factory)
        self.down_proj = _lora(config, config.intermediate, config.hidden, False, factory)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config, factory):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden, config.rms_eps, factory)
        self.self_attn = Attention(config, factory)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.rms_eps, factory)
        self.mlp = MLP(config, factory)

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class QwenLora(nn.Module):
    """The whole model; parameters are seeded from config.seed, built on CPU in float32, then
    moved to ``device`` and cast to config.dtype. Only lora_A / lora_B require grad.

    ``init_on_device=True`` builds the parameters on ``device`` in config.dtype and draws them
    from a generator there instead: for sizes whose float32 CPU copy would not fit or would take
    minutes to draw (the GPU-size benchmarks). Its bits are not those of the CPU init."""

    def __init__(self, config, device="cpu", *, init_on_device=False):
        super().__init__()
        self.config = config
        factory = ({"device": torch.device(device), "dtype": config.dtype} if init_on_device
                   else {"device": "cpu"})
        self.embed_tokens = nn.utils.skip_init(nn.Embedding, config.vocab, config.hidden,
                                               **factory)
        self.layers = nn.ModuleList(DecoderLayer(config, factory) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps, factory)
        self.lm_head = nn.utils.skip_init(nn.Linear, config.hidden, config.vocab, bias=False,
                                          **factory)
        self._plant_handle, self.planted = None, None
        self._init_weights(factory["device"])
        self.to(device, config.dtype)

    @torch.no_grad()
    def _init_weights(self, device):
        # One local generator, drawn in module order: with the CPU init the same seed gives the
        # same bits on any device, since values are made on CPU in float32 before the move.
        g = torch.Generator(device=device).manual_seed(self.config.seed)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02, generator=g)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, LoraLinear):
                module.lora_A.normal_(0.0, 0.02, generator=g)
                # B is not zero (unlike usual LoRA) so A's gradient is nonzero from step one.
                module.lora_B.normal_(0.0, 0.01, generator=g)
        for name, p in self.named_parameters():
            p.requires_grad_(name.endswith(("lora_A", "lora_B")))

    def forward(self, ids, positions=None):
        """ids: int64 [batch, seq]; positions: int64 [batch, seq] or [seq], default 0..seq-1.
        Returns float32 logits [batch, seq, vocab]."""
        if ids.dim() != 2 or ids.dtype != torch.int64:
            raise ValueError(f"ids: want int64 [batch, seq], got {ids.dtype} {list(ids.shape)}")
        b, s = ids.shape
        if positions is None:
            positions = torch.arange(s, device=ids.device)
        positions = positions.expand(b, s)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, positions)
        return self.lm_head(self.norm(x)).float()

    def plant(self, module_name, residue_fn):
        """Adds residue_fn(output) to the output of the module named module_name (a name from
        named_modules()), through a forward hook; replaces any earlier plant."""
        modules = dict(self.named_modules())
        if module_name not in modules:
            some = [n for n in modules if n][:6]
            raise ValueError(f"plant: no module named {module_name!r}; valid names include "
                             f"{some} ... ({len(modules)} in all)")
        self.unplant()

        def hook(module, inputs, output):
            return output + residue_fn(output)

        self._plant_handle = modules[module_name].register_forward_hook(hook)
        self.planted = module_name

    def unplant(self):
        """Removes the planted fault, if any."""
        if self._plant_handle is not None:
            self._plant_handle.remove()
        self._plant_handle, self.planted = None, None


def lora_parameters(model):
    """The trainable (name, parameter) pairs of model, sorted by name."""
    return sorted(((n, p) for n, p in model.named_parameters() if p.requires_grad),
                  key=lambda item: item[0])


def fixed_batch(config, batch, seq, seed, microbatches):
    """A list of ``microbatches`` (ids, targets) pairs of int64 CPU tensors [batch, seq]; targets
    are ids shifted by one. A pure function of its arguments (local generator)."""
    for name, value in (("batch", batch), ("seq", seq), ("microbatches", microbatches)):
        if value < 1:
            raise ValueError(f"fixed_batch: {name}={value}: must be >= 1")
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, config.vocab, (batch, seq + 1), generator=g, dtype=torch.int64)
              for _ in range(microbatches)]
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def loss_fn(logits, targets):
    """Mean next-token cross entropy, computed in float32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
