"""lockstep.invariant: the mode's scope and its record in the execution context, and the
kernels' bits independent of what else a call holds (packed against alone), against float64
references, with gradients through autograd and errors as lockstep.errors."""

import math

import pytest
import torch

import lockstep
from lockstep import errors, invariant


def test_the_scope_nests_and_is_recorded_in_the_execution_context():
    assert not invariant.mode_on()
    off = lockstep.determinism.execution_context()
    with invariant.placement_invariant():
        with invariant.placement_invariant():
            assert invariant.mode_on()
        assert invariant.mode_on()
        on = lockstep.determinism.execution_context()
    assert not invariant.mode_on()
    assert off["stable"]["determinism"]["placement_invariant"] is False
    assert on["stable"]["determinism"]["placement_invariant"] is True
    assert lockstep.determinism.context_digest(on) != lockstep.determinism.context_digest(off)


def test_a_linear_rows_bits_do_not_depend_on_the_other_rows():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 40, generator=g, dtype=torch.float64)
    w = torch.randn(24, 40, generator=g, dtype=torch.float64)
    alone = invariant.linear(x, w)
    packed = invariant.linear(torch.cat([torch.randn(63, 40, dtype=torch.float64), x]), w)
    assert torch.equal(packed[63:], alone)
    assert torch.equal(invariant.linear(x[3:4], w)[0], alone[3])
    torch.testing.assert_close(alone, x @ w.T, rtol=1e-13, atol=1e-13)


def test_gradients_flow_through_autograd():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(7, 5, generator=g, dtype=torch.float64)
    mine = torch.autograd.grad(invariant.gelu(invariant.linear(x, w)), (x, w), dy)
    theirs = torch.autograd.grad(torch.nn.functional.gelu(x @ w.T), (x, w), dy)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def tokens(sequence, n):
    return torch.stack([torch.full((n,), sequence), torch.arange(n)], 1)


def test_a_sequences_attention_is_the_same_bits_alone_and_packed():
    g = torch.Generator().manual_seed(3)
    qa, ka, va = (torch.randn(5, 8, generator=g) for _ in range(3))
    qb, kb, vb = (torch.randn(7, 8, generator=g) for _ in range(3))
    alone = invariant.sequence_attention(qa, ka, va, tokens(3, 5), tokens(3, 5), scale=0.35)
    order = torch.randperm(12, generator=g)
    keys_tokens = torch.cat([tokens(9, 7), tokens(3, 5)])[order]
    packed = invariant.sequence_attention(
        torch.cat([qb, qa]), torch.cat([kb, ka])[order], torch.cat([vb, va])[order],
        torch.cat([tokens(9, 7), tokens(3, 5)]), keys_tokens, scale=0.35)
    assert torch.equal(packed[7:], alone)
    visible = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = (qa.double() @ ka.double().T * 0.35).masked_fill(~visible, float("-inf"))
    torch.testing.assert_close(alone.double(), scores.softmax(1) @ va.double(), rtol=1e-6,
                               atol=1e-7)


def test_bad_tokens_raise_lockstep_errors_naming_them():
    q = torch.randn(2, 4)
    with pytest.raises(errors.InvalidArgumentError, match="sees no key"):
        invariant.sequence_attention(q, q, q, tokens(1, 2), tokens(2, 2), scale=1.0)
    with pytest.raises(errors.InvalidArgumentError, match="do not chain"):
        invariant.linear(torch.randn(2, 3), torch.randn(2, 4))


def test_layer_norm_and_cross_entropy_rows_do_not_depend_on_the_other_rows():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 20, generator=g, dtype=torch.float64) * 3
    weight = torch.randn(20, generator=g, dtype=torch.float64)
    bias = torch.randn(20, generator=g, dtype=torch.float64)
    alone = invariant.layer_norm(x, weight, bias)
    packed = invariant.layer_norm(torch.cat([torch.randn(50, 20, dtype=torch.float64), x]),
                                  weight, bias)
    assert torch.equal(packed[50:], alone)
    torch.testing.assert_close(alone, torch.nn.functional.layer_norm(x, (20,), weight, bias),
                               rtol=1e-12, atol=1e-12)
    targets = torch.tensor([0, 19, 3, 3, 7, 1])
    nll = invariant.cross_entropy(x, targets)
    assert torch.equal(invariant.cross_entropy(torch.cat([x[3:], x[:3]]),
                                               torch.cat([targets[3:], targets[:3]]))[3:],
                       nll[:3])
    torch.testing.assert_close(
        nll, torch.nn.functional.cross_entropy(x, targets, reduction="none"),
        rtol=1e-12, atol=1e-12)
    leaf = x.clone().requires_grad_(True)
    invariant.cross_entropy(leaf, targets).sum().backward()
    ref = x.clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(ref, targets, reduction="sum").backward()
    torch.testing.assert_close(leaf.grad, ref.grad, rtol=1e-12, atol=1e-12)


def test_layer_norm_and_cross_entropy_refuse_what_does_not_fit():
    with pytest.raises(errors.InvalidArgumentError, match="eps 0 is not positive"):
        invariant.layer_norm(torch.ones(2, 3), torch.ones(3), torch.zeros(3), eps=0)
    with pytest.raises(errors.InvalidArgumentError, match="target 4 outside"):
        invariant.cross_entropy(torch.zeros(2, 4), torch.tensor([0, 4]))


def test_exact_gradients_are_the_same_bits_however_the_rows_were_called():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(30, 6, generator=g)
    dy = torch.randn(30, 4, generator=g)
    ids = torch.randint(0, 5, (30,), generator=g)

    def step(cuts):
        w = torch.randn(4, 6, generator=torch.Generator().manual_seed(9)).requires_grad_()
        table = torch.randn(5, 6, generator=torch.Generator().manual_seed(10)).requires_grad_()
        scale, shift = torch.ones(6, requires_grad=True), torch.zeros(6, requires_grad=True)
        exact = invariant.ExactGradients(
            {"w": w, "table": table, "norm.weight": scale, "norm.bias": shift})
        with invariant.placement_invariant():
            for a, b in zip(cuts, cuts[1:]):
                h = invariant.embedding(table, ids[a:b], exact=exact, name="table") + x[a:b]
                h = invariant.layer_norm(h, scale, shift, exact=exact,
                                         weight_name="norm.weight", bias_name="norm.bias")
                invariant.linear(h, w, exact=exact, name="w").backward(dy[a:b])
        assert w.grad is None, "the gradient went to .grad before write_gradients"
        total = exact.sums("w")
        exact.write_gradients()
        assert torch.equal(w.grad.double(), total.float().double())
        return [p.grad for p in (w, table, scale, shift)]

    whole = step([0, 30])
    for cuts in ([0, 1, 17, 30], [0, 29, 30]):
        for a, b in zip(step(cuts), whole):
            assert torch.equal(a, b)
    ref_w = torch.randn(4, 6, generator=torch.Generator().manual_seed(9)).requires_grad_()
    ref_table = torch.randn(5, 6, generator=torch.Generator().manual_seed(10)).requires_grad_()
    h = torch.nn.functional.layer_norm(ref_table[ids] + x, (6,))
    (h @ ref_w.T).backward(dy)
    torch.testing.assert_close(whole[0], ref_w.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(whole[1], ref_table.grad, rtol=1e-5, atol=1e-5)


def test_exact_gradients_refuse_what_they_cannot_hold():
    w = torch.zeros(2, 2, requires_grad=True)
    exact = invariant.ExactGradients([("layer.w", w)])
    with pytest.raises(errors.InvalidArgumentError, match="parameter's name"):
        invariant.linear(torch.ones(1, 2), w, exact=exact)
    with pytest.raises(errors.LockstepError, match="no parameter 'other'"):
        invariant.linear(torch.ones(1, 2), w, exact=exact, name="other")
    v = torch.zeros(2, 2, requires_grad=True)
    out = invariant.linear(torch.full((1, 2), 1e4), v, exact=invariant.ExactGradients({"v": v}),
                           name="v")
    with pytest.raises(RuntimeError, match="not below 2\\^24"):
        out.backward(torch.full((1, 2), 1e4))


def test_an_exact_sum_is_the_same_bits_in_every_grouping_and_order():
    g = torch.Generator().manual_seed(7)
    # Magnitudes from 2^-40 to 2^20: a float64 sum rounds differently in different orders.
    values = (torch.randn(4096, generator=g, dtype=torch.float64)
              * torch.pow(2.0, torch.randint(-40, 21, (4096,), generator=g).double()))
    values = values.float().double()  # on the 2^-80 grid, so each add rounds nothing
    expected = math.fsum(values.tolist())  # the exact sum, rounded once
    at_once = invariant.ExactSum()
    at_once.add(values)
    backwards = invariant.ExactSum()
    for piece in reversed(torch.split(values, 333)):
        backwards.add(piece.reshape(-1, 3) if piece.numel() % 3 == 0 else piece)
    assert at_once.total() == backwards.total() == expected
    # Summed in float64 in two orders, the same values give other bits: why the class exists.
    listed = values.tolist()
    assert sum(listed) != sum(reversed(listed))
    at_once.sum_over(None)  # no group: nothing to do
    assert at_once.total() == expected
    at_once.zero()
    assert at_once.total() == 0.0


def test_an_exact_sum_refuses_what_it_cannot_hold_and_adds_nothing():
    total = invariant.ExactSum()
    total.add(torch.tensor([1.5, 2.25]))
    with pytest.raises(errors.OutOfRangeError):
        total.add(torch.tensor([1.0, 2.0 ** 30]))
    with pytest.raises(errors.OutOfRangeError, match="not finite"):
        total.add(torch.tensor([float("nan")]))
    assert total.total() == 3.75
