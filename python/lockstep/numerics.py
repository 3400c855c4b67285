"""Evidence that two runs match, or where they differ: strict comparison and digests.

- ``compare(actual, expected, **tolerance)``: a ``Comparison`` of two tensors;
  ``compare_state(actual, expected, **tolerance)``: a ``SetComparison`` of two named sets (a
  state_dict, a module, a (module, optimizer) pair, or a list of (name, tensor)). Tolerance
  keywords: ``atol``, ``rtol``, ``relative_l2``, ``nan_equal``, ``bitwise``; the defaults are
  numerics::Tolerance's. The figures and ``json()`` are those of the C++ library and the
  ``compare`` tool.
- ``inventory(obj)``: an ``Inventory`` (names, dtypes, shapes, per-tensor digests and the state
  digest) of the same kinds of object, or of a safetensors file's path: the same digests as the
  C++ library, the ``inventory`` tool and numerics/digest_reference.py.
- ``module_state(module, optimizer=None)``: the named set lockstep digests for a model and its
  optimizer (numerics/module_state.h): parameters and buffers by module path, each parameter's
  optimizer state as "optimizer/<path>/<field>" (``optimizer_entries``: the same without the
  prefix), a step as a 0-d int64 tensor.
- ``write_safetensors(path, tensors, metadata)`` / ``read_safetensors(path)``: safetensors files
  through the C++ library's one writer (atomic) and reader (checked).
"""

import contextlib
import gc
import json
import os

import torch

from . import _C

tensor_digest = _C.tensor_digest

_OPTIMIZER_FIELDS = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                     "sum", "square_avg", "grad_avg")


class _Result:
    """A result read from the library's JSON: its keys are attributes."""

    def __init__(self, text):
        self._text = text
        self._fields = json.loads(text)

    def __getattr__(self, name):
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(name) from None

    def json(self):
        """The JSON the C++ library writes for this result."""
        return self._text

    def as_dict(self):
        return dict(self._fields)


class Comparison(_Result):
    """One tensor's comparison: passed, outcome, max_abs_diff, max_tolerance_ratio,
    relative_l2, over_tolerance, first_offending_index, detail, ..."""

    def __bool__(self):
        return bool(self.passed)

    def __repr__(self):
        return (f"<Comparison {self.name!r} {self.outcome} max|a-b| {self.max_abs_diff} "
                f"rel L2 {self.relative_l2}>")


class SetComparison(_Result):
    """A named set's comparison: all_passed, passed, failed, tensors (a Comparison each),
    worst_by_tolerance_ratio, worst_by_relative_l2."""

    def __init__(self, text):
        super().__init__(text)
        self.tensors = [Comparison(json.dumps(t)) for t in self._fields["tensors"]]

    def __bool__(self):
        return bool(self.all_passed)

    def __repr__(self):
        return f"<SetComparison {self.passed} passed, {self.failed} failed>"


class Inventory(_Result):
    """state_digest, tensors (a count), bytes, entries (name, dtype, shape, digest, ...).

    The digest, the count and the bytes come from the library directly; the JSON (``json()``,
    ``entries`` and the other fields) is written and read only when first asked for.
    """

    def __init__(self, source):
        """``source``: the library's inventory, or its JSON text (as ``json()`` gives)."""
        self._handle = None
        if isinstance(source, str):
            _Result.__init__(self, source)
        else:
            self._handle = source  # _Result.__init__ runs on the JSON's first use

    def __reduce__(self):  # pickled and copied as its JSON
        return (Inventory, (self.json(),))

    def _field(self, name):
        if self._handle is not None:
            return getattr(self._handle, name)
        return self._fields[name]

    @property
    def state_digest(self):
        return self._field("state_digest")

    @property
    def tensors(self):
        return self._field("tensors")

    @property
    def bytes(self):
        return self._field("bytes")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        self._load()
        return _Result.__getattr__(self, name)

    def _load(self):
        if "_fields" not in self.__dict__:
            _Result.__init__(self, self._handle.json())

    def json(self):
        self._load()
        return self._text

    def as_dict(self):
        self.json()
        return dict(self._fields)

    def __repr__(self):
        return f"<Inventory {self.tensors} tensors, state digest {self.state_digest}>"


@contextlib.contextmanager
def _collection_paused():
    """Python's cyclic garbage collection paused: building a named set of tens of thousands of
    tensors would otherwise trigger collections that each scan every live object."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _optimizer_entries(module, optimizer, detach):
    paths = {id(p): name for name, p in module.named_parameters()}
    entries = []
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            state = optimizer.state.get(p)
            if not state:
                continue
            prefix = paths.get(id(p), f"group{g}/param{i}")
            for field in _OPTIMIZER_FIELDS:
                value = state.get(field)
                if value is None:
                    continue
                if field == "step":
                    value = torch.tensor(int(value), dtype=torch.int64)
                elif detach:
                    value = value.detach()
                entries.append((f"{prefix}/{field}", value))
    return entries


def optimizer_entries(module, optimizer):
    """``optimizer``'s state as ``(<parameter path>/<field>, tensor)`` pairs, each parameter named
    by its path in ``module`` (a step as a 0-d int64 tensor).

    Example::

        >>> dict(optimizer_entries(model, opt))["fc.weight/exp_avg"].shape
        torch.Size([4, 8])
    """
    with _collection_paused():
        return _optimizer_entries(module, optimizer, detach=True)


def _module_state(module, optimizer, detach):
    with _collection_paused():
        state = module.state_dict(keep_vars=True)
        if detach:
            named = [(name, t.detach()) for name, t in state.items()]
        else:
            named = list(state.items())
        if optimizer is not None:
            named += [(f"optimizer/{name}", t)
                      for name, t in _optimizer_entries(module, optimizer, detach)]
        named.sort(key=lambda entry: entry[0])
        return named


def module_state(module, optimizer=None):
    """The named set of ``module`` (and ``optimizer``): see the module's docstring. The tensors
    are detached from autograd.

    Example::

        >>> names = [name for name, _ in module_state(model, opt)]
        >>> names[:2]
        ['fc.bias', 'fc.weight']
    """
    return _module_state(module, optimizer, detach=True)


def _named(obj, detach=True):
    """``obj`` as a list of (name, tensor). Without ``detach``, the tensors as given, for the
    library's readers, which run without autograd."""
    if isinstance(obj, torch.nn.Module):
        return _module_state(obj, None, detach)
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], torch.nn.Module):
        return _module_state(obj[0], obj[1], detach)
    if isinstance(obj, dict):
        obj = obj.items()
    elif not isinstance(obj, (list, tuple)):
        raise TypeError(f"a module, (module, optimizer), state_dict or list of (name, tensor), "
                        f"not {type(obj).__name__}")
    with _collection_paused():
        if detach:
            return [(str(k), v.detach()) for k, v in obj]
        return [(k if type(k) is str else str(k), v) for k, v in obj]


def compare(actual, expected, name="", **tolerance):
    """``actual`` against ``expected`` (the reference) under the tolerance keywords."""
    return Comparison(_C._compare_tensors(actual, expected, name, **tolerance))


def compare_state(actual, expected, **tolerance):
    """Two named sets, every name in either (a name in one only fails)."""
    return SetComparison(_C._compare_sets(_named(actual, detach=False),
                                          _named(expected, detach=False), **tolerance))


def inventory(obj):
    """The inventory of a named set or of a safetensors file (a path)."""
    if isinstance(obj, (str, os.PathLike)):
        return Inventory(_C._inventory_of_file(os.fspath(obj)))
    return Inventory(_C._inventory(_named(obj, detach=False)))


def write_safetensors(path, tensors, metadata=None):
    """Writes ``tensors`` (a named set, as ``inventory`` takes) to ``path`` as a safetensors file,
    atomically, with the string ``metadata`` dict in its header."""
    _C._write_safetensors(os.fspath(path), _named(tensors, detach=False),
                          {str(k): str(v) for k, v in (metadata or {}).items()})


def read_safetensors(path):
    """The ``(name, tensor)`` list and the metadata dict of the safetensors file at ``path``."""
    tensors, metadata = _C._read_safetensors(os.fspath(path))
    return list(tensors), dict(metadata)
