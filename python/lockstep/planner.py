"""Microbatch plans: sequences packed under a token budget, sharded over a CP group.

``plan_microbatches(lengths, max_tokens, cp_size=1, packing="first_fit_decreasing",
loss_normalization="token_mean", ids=None, loss_weights=None)`` returns a ``Plan``:

- ``num_microbatches``, ``num_tokens``, ``num_sequences``, ``cp_size``, ``packing_efficiency``;
- ``microbatch(i)``: its packing ({"num_tokens", "batch_index", "sequence_id", "cu_seqlens"});
- ``position_ids(i)``, ``token_loss_weights(i)``: per packed token (int64 / float64 tensors);
- ``shard_token_indices(i, cp_rank)``: offsets into microbatch i's packed tokens that CP rank
  ``cp_rank`` owns (zigzag chunks; empty for a rank that owns nothing);
- ``digest``: the hex SHA-256 replicas compare to agree on the plan; ``serialize()``: its bytes;
  ``split(i)``: the plan with microbatch i halved (as recovery from out-of-memory does);
  ``verify()``: the plan checked against its batch.

``parse_plan(data, lengths, ids=None, loss_weights=None)`` reads serialized bytes and verifies
them against the batch (a ``DataLossError`` or ``InvalidArgumentError`` otherwise).
"""

from . import _C

Plan = _C.Plan
plan_microbatches = _C.plan_microbatches
parse_plan = _C.parse_plan
