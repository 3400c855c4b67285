"""Placement-invariant mode: a sequence's bits whatever else its microbatch holds.

With PyTorch's kernels a sequence's outputs depend on where it was placed: packed after other
sequences, split across microbatches by out-of-memory recovery or sharded over CP ranks, its
products, softmaxes and GELUs round differently, so two runs that pack one batch differently can
only be compared within a tolerance. These kernels compute every output element by the same
float64 operations in the same order whatever the call holds (docs/placement_invariance.md):

    import torch, lockstep
    with lockstep.invariant.placement_invariant():
        h = lockstep.invariant.linear(x, w)           # row i depends on x[i] only
        n = lockstep.invariant.layer_norm(h, g, b)    # so does each row here
        loss = lockstep.invariant.cross_entropy(logits, targets)
        a = lockstep.invariant.sequence_attention(q, k, v, tokens, tokens, scale=0.125)

``tokens`` is int64 [rows, 2]: each row's (sequence id, position); a query attends to the keys of
its own sequence at positions up to its own, in position order. The mode's scope is recorded in
the execution context (``lockstep.determinism.execution_context()``), so runs with and without it
are told apart. Every function is differentiable; CPU and CUDA tensors of float32, float64,
bfloat16 and float16.
"""

import contextlib

from . import _C
from . import errors

# ExactGradients objects that kernels were given and whose sums were not yet written or zeroed:
# kept alive here, since the kernels' backward holds their address.
_live = set()


class ExactGradients:
    """Every named parameter's gradient summed exactly over the rows of each call, the step's
    microbatches and (``sum_over``) the ranks, and rounded once: the same bits in every grouping
    and order (docs/placement_invariance.md, Note [Exact accumulation]). The kernels given one
    (``exact=`` and the parameter's ``name``) add each token's contribution here instead of into
    ``.grad``; ``write_gradients`` sets ``.grad``.

    ``parameters``: a dict of name to tensor, or (name, tensor) pairs such as
    ``model.named_parameters()``. A contribution of magnitude 2^24 or more, or more than 2^22
    contributions to one element, raises ``lockstep.errors.OutOfRangeError`` naming the parameter.

    Example::

        >>> exact = lockstep.invariant.ExactGradients({"w": w})
        >>> with lockstep.invariant.placement_invariant():
        ...     for x, dy in microbatches:
        ...         lockstep.invariant.linear(x, w, exact=exact, name="w").backward(dy)
        >>> exact.sum_over(group)      # optional: an exact all-reduce over a group
        >>> exact.write_gradients()    # w.grad, rounded once; the sums start again from zero
    """

    def __init__(self, parameters):
        items = list(parameters.items() if isinstance(parameters, dict) else parameters)
        self._c = _C._ExactGradients([(str(n), t) for n, t in items])

    def _slot(self, name):
        if name is None:
            raise errors.InvalidArgumentError("exact gradients need the parameter's name",
                                           "INVALID_ARGUMENT")
        _live.add(self)
        return self._c.slot_of(name)

    def sum_over(self, group=None, *, whole=()):
        """Replaces every sum by its sum over ``group`` (an adopted communicator,
        ``lockstep.distributed``; exact: an integer all-reduce), except the parameters named in
        ``whole``, which every member already holds in full. ``None``: nothing to do."""
        self._c.sum_over(group, set(whole))

    def write_gradients(self):
        """Sets each parameter's ``.grad`` to its sum (float64, then the parameter's dtype) and
        zeroes the sums."""
        self._c.write_gradients()
        _live.discard(self)

    def zero(self):
        """Zeroes the sums without writing them."""
        self._c.zero()
        _live.discard(self)

    def sums(self, name):
        """Parameter ``name``'s sums as a float64 CPU tensor shaped like it (nothing written).

        Example::

            >>> exact.sums("w").dtype
            torch.float64
        """
        return self._c.sums(self._c.slot_of(name))


class ExactSum:
    """One number summed exactly: every value added is rounded once to a multiple of 2^-80 and the
    sum is an integer, so its total is the same bits whatever the grouping and order of the adds
    and of the ranks (``sum_over``). For what a placement-invariant step reports beside its
    gradients, such as the loss summed over microbatches and ranks. A value of magnitude 2^24 or
    more, or not finite, raises ``lockstep.errors.OutOfRangeError`` and adds nothing.

    Example::

        >>> loss_sum = lockstep.invariant.ExactSum()
        >>> for logits, targets in microbatches:
        ...     loss_sum.add(lockstep.invariant.cross_entropy(logits, targets).detach())
        >>> loss_sum.sum_over(group)   # optional: an exact all-reduce over a group
        >>> loss_sum.total()           # a float, rounded once
    """

    def __init__(self):
        self._c = _C._ExactSum()

    def add(self, values):
        """Adds every element of ``values`` (a floating-point tensor of any shape, any device)."""
        self._c.add(values)

    def sum_over(self, group=None):
        """Replaces the sum by its sum over ``group``'s members (an adopted communicator,
        ``lockstep.distributed``; an exact integer all-reduce). ``None``: nothing to do."""
        self._c.sum_over(group)

    def total(self):
        """The sum rounded once to a float (float64); the sum stays."""
        return self._c.total()

    def zero(self):
        """Sets the sum to zero."""
        self._c.zero()


def _destination(exact, name):
    return (None, -1) if exact is None else (exact._c, exact._slot(name))


@contextlib.contextmanager
def placement_invariant():
    """Placement-invariant mode for the block's duration (scopes nest).

    Example::

        >>> with lockstep.invariant.placement_invariant():
        ...     lockstep.invariant.mode_on()
        True
    """
    scope = _C._PlacementInvariantScope()
    try:
        yield
    finally:
        del scope


def mode_on():
    """Whether placement-invariant mode is on in this process.

    Example::

        >>> lockstep.invariant.mode_on()
        False
    """
    return _C._placement_invariant_on()


def linear(x, weight, *, exact=None, name=None):
    """``x @ weight.T`` (x [M, K], weight [N, K]), each element summed over K in float64 in
    increasing order and rounded once: row i's bits depend on ``x[i]`` only. With ``exact`` (an
    ``ExactGradients``) the weight's gradient goes there, under ``name``.

    Example::

        >>> y = lockstep.invariant.linear(torch.randn(5, 8), torch.randn(3, 8))
        >>> y.shape
        torch.Size([5, 3])
    """
    return _C._invariant_linear(x, weight, *_destination(exact, name))


def embedding(weight, ids, *, exact=None, name=None):
    """Rows ``ids`` (int64 [T]) of weight [V, K]: [T, K]. Its backward adds each token's
    gradient to its row, exactly with ``exact`` (an ``ExactGradients``, under ``name``).

    Example::

        >>> lockstep.invariant.embedding(torch.eye(3), torch.tensor([2, 0]))
        tensor([[0., 0., 1.],
                [1., 0., 0.]])
    """
    return _C._invariant_embedding(weight, ids, *_destination(exact, name))


def gelu(x):
    """The exact (erf) GELU of ``x``, every element by one scalar float64 path.

    Example::

        >>> lockstep.invariant.gelu(torch.zeros(2))
        tensor([0., 0.])
    """
    return _C._invariant_gelu(x)


def layer_norm(x, weight, bias, *, eps=1e-5, exact=None, weight_name=None, bias_name=None):
    """``torch.nn.functional.layer_norm`` of each row of x [M, K] with weight and bias [K]: the
    row's mean and variance summed over K in float64 in increasing order, the rest elementwise in
    float64, rounded once: row i's bits depend on ``x[i]`` only. With ``exact`` the weight's and
    bias's gradients go there under ``weight_name`` and ``bias_name``. Raises
    ``lockstep.errors.InvalidArgumentError`` for shapes that do not fit or ``eps`` not positive.

    Example::

        >>> y = lockstep.invariant.layer_norm(torch.randn(5, 8), torch.ones(8), torch.zeros(8))
        >>> y.shape
        torch.Size([5, 8])
    """
    exact_c, weight_slot = _destination(exact, weight_name)
    _, bias_slot = _destination(exact, bias_name)
    return _C._invariant_layer_norm(x, weight, bias, float(eps), exact_c, weight_slot, bias_slot)


def cross_entropy(logits, targets):
    """Each row's cross-entropy (``reduction='none'``) of logits [M, V] against int64 targets
    [M]: the row's log-sum-exp over V in float64 in increasing order, minus its target's logit.
    Raises ``lockstep.errors.InvalidArgumentError`` for a target outside [0, V).

    Example::

        >>> nll = lockstep.invariant.cross_entropy(torch.zeros(2, 4), torch.tensor([0, 3]))
        >>> nll
        tensor([1.3863, 1.3863])
    """
    return _C._invariant_cross_entropy(logits, targets)


def sequence_attention(q, k, v, query_tokens, key_tokens, *, scale):
    """Causal attention of q [Mq, D] over k [Mk, D] and v [Mk, Dv] within each sequence:
    softmax(scale * q k^T) v over the keys whose (sequence id, position) token has the query's id
    and a position at most its own, in position order, in float64. Keys with a negative id are
    padding. Raises ``lockstep.errors.InvalidArgumentError`` for two keys with one token or a
    query that sees no key.

    Example::

        >>> tokens = torch.tensor([[0, 0], [0, 1], [1, 0]])
        >>> out = lockstep.invariant.sequence_attention(q, k, v, tokens, tokens, scale=0.5)
    """
    return _C._invariant_sequence_attention(q, k, v, query_tokens, key_tokens, float(scale))


def sharded_sequence_attention(q, k, v, tokens, *, scale, widest, group=None):
    """``sequence_attention`` of this CP member's rows (q, k, v and their tokens) over every
    member's keys: ``group`` is an adopted communicator (``lockstep.distributed``), ``widest`` the
    largest member's row count. Backward gathers the queries so that every key's gradient is
    summed over all of its sequence's queries, as unsharded attention would. Every member calls it.
    """
    return _C._invariant_sharded_sequence_attention(q, k, v, tokens, float(scale), int(widest),
                                                    group)
