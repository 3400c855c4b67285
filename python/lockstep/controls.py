"""Negative controls: bugs planted on purpose, to show that a check can fail.

- ``nondeterministic_residue(output)``: about zero, but with different bits from call to call
  (on a CUDA tensor from floating-point atomics, on the CPU from the ``lockstep_controls::
  shuffled_sum`` operator, which sums in an order drawn from the OS on every call). Added to a
  module's output it makes that module nondeterministic, as a real unordered reduction does;
  the operator recorder names the operator, the module recorder the module.
- ``plant_nondeterminism(module)``: adds that residue to ``module``'s output through a forward
  hook; returns the hook's handle (``handle.remove()`` takes it out).

Example::

    handle = lockstep.controls.plant_nondeterminism(model.layers[1].mlp)
    ...  # repeatability now fails, naming layers.1.mlp
    handle.remove()
"""

import torch

from . import _C


def nondeterministic_residue(output):
    """A tensor like ``output`` (no autograd history) whose bits differ from call to call."""
    return _C._rounding_residue(output)


def plant_nondeterminism(module):
    """Makes ``module``'s output nondeterministic (see the module's docstring); returns the
    forward hook's handle."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"plant_nondeterminism takes a torch.nn.Module, not "
                        f"{type(module).__name__}")

    def hook(_module, _inputs, output):
        return output + nondeterministic_residue(output)

    return module.register_forward_hook(hook)
