"""Where two runs of a PyTorch program first differ: the module recorder and the operator
recorder (numerics/divergence.h and numerics/op_recorder.h in the C++ library), writing the
recordings ``tools/diverge`` reads.

Module recorder. ``with ModuleRecorder(model) as recorder:`` hooks every submodule of ``model``:
forward, each module's output is recorded (a digest and a summary, and the tensor itself for the
first ``keep_full_tensors`` records); backward, the gradient arriving at its output and the one
leaving through its first tensor input. Each trainable parameter is tapped too: every backward's
contribution as it arrives, and (when the block ends) its accumulated ``.grad``, so a differing
gradient is localized to a contribution (the model's backward) or to the accumulation. Leaving
the block removes every hook; ``recorder.recording`` is the ``Recording``.

Operator recorder. ``with OperatorRecorder(path, module=model):`` records every ATen operator
call made in the block (forward and backward, from every thread) to ``path`` (JSON lines): the
operator, the module it ran in (the innermost module whose forward was running, else the
``label``), digests of its inputs as they were when it started and of its outputs, and their
sums. ``recorder.scope(label)`` labels a stretch of the program itself. One at a time per
process.

``first_divergence(a, b)`` and ``first_operator_divergence(a_path, b_path)`` compare two runs'
recordings (as ``tools/diverge`` does). Use one recorder per pass: the module recorder's own
digests are operator calls that the operator recorder would record.

Example::

    with lockstep.recording.ModuleRecorder(model, keep_full_tensors=64) as rec:
        loss_fn(model(x), y).backward()
    rec.recording.save("run_a.rec")          # tools/diverge run_a.rec run_b.rec
    first = lockstep.recording.first_divergence(rec.recording, Recording.load("run_b.rec"))
    if first is not None:
        print(first.module, first.kind)      # e.g. layers.1.mlp forward_output
"""

import json
import os

import torch

from . import _C
from .numerics import _Result


class Recording:
    """One run's module records, in execution order (``records``: a list of dicts with index,
    module, kind, dtype, shape, digest, summary, kept)."""

    def __init__(self, native):
        self._native = native

    @classmethod
    def load(cls, path):
        """The recording saved at ``path`` (``InvalidArgumentError`` for one that is not)."""
        return cls(_C._Recording.load(os.fspath(path)))

    def save(self, path):
        """Writes the recording to ``path`` (a safetensors file ``tools/diverge`` reads)."""
        self._native.save(os.fspath(path))

    @property
    def records(self):
        return json.loads(self._native.records_json())

    def modules(self):
        """The modules (and parameters) recorded, in first-seen order."""
        seen = {}
        for record in self.records:
            seen.setdefault(record["module"], None)
        return list(seen)

    def __len__(self):
        return len(self._native)

    def __repr__(self):
        return f"<Recording {len(self)} records>"


class Divergence(_Result):
    """Where two recordings first differ: index, module, kind, reason, a, b, comparison (when
    both records kept their tensors), summary (one line)."""

    def __repr__(self):
        return f"<Divergence at {self.module} ({self.kind}, record {self.index}, {self.reason})>"


def first_divergence(a, b, **tolerance):
    """The first record where ``a`` and ``b`` differ (a ``Divergence``), or None. The tolerance
    keywords (atol, rtol, relative_l2, nan_equal, bitwise) apply to the kept tensors'
    comparison; digests decide whether records differ."""
    result = Divergence(_C._first_divergence(a._native, b._native, **tolerance))
    return result if result.diverged else None


def localize_parameter_gradient(a, b, name):
    """Where parameter ``name``'s gradient first differs: a result with ``verdict`` "same",
    "incoming" (a backward's contribution differs) or "accumulation" (the same contributions
    were added up differently)."""
    return _Result(_C._localize_parameter_gradient(a._native, b._native, name))


def compare_recordings(a, b):
    """Two recordings compared as the variability checks compare them: ``first_divergence``,
    ``records`` (per record: digest_equal and, where kept, the comparison's figures),
    ``leaf_gradients`` (each differing parameter's localization), ``summary``,
    ``leaves_summary``."""
    return _Result(_C._compare_recordings(a._native, b._native))


def _named_modules(module):
    return [(name, m) for name, m in module.named_modules() if name]


def _first_tensor(args):
    for i, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            return i
    return None


class ModuleRecorder:
    """Records ``module``'s submodules and trainable parameters while the block runs (see the
    module's docstring).

    ``keep_full_tensors``: how many records (the first, in execution order) also keep their
    tensor, so a divergence there comes with the full comparison. ``parameters``: the
    ``(name, tensor)`` leaves to tap (default: every parameter of ``module`` that requires grad).
    """

    def __init__(self, module, *, keep_full_tensors=0, parameters=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"ModuleRecorder records a torch.nn.Module, not {type(module).__name__}")
        if keep_full_tensors < 0:
            raise ValueError(f"keep_full_tensors={keep_full_tensors} must be >= 0")
        self._module = module
        self._keep = int(keep_full_tensors)
        self._parameters = list(parameters) if parameters is not None else [
            (n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._native = None
        self._handles = []
        self._taps = []
        self.recording = None

    def _pre_hook(self, name):
        def hook(_module, args):
            i = _first_tensor(args)
            if i is None or not args[i].requires_grad:
                return None
            return args[:i] + (self._native.enter(name, args[i]),) + args[i + 1:]
        return hook

    def _hook(self, name):
        def hook(_module, _args, output):
            if isinstance(output, torch.Tensor):
                return self._native.exit(name, output)
            if isinstance(output, (tuple, list)):
                return type(output)(self._native.exit(f"{name}#{i}", o)
                                    if isinstance(o, torch.Tensor) else o
                                    for i, o in enumerate(output))
            return None
        return hook

    def __enter__(self):
        if self._native is not None:
            raise RuntimeError("this ModuleRecorder is already recording")
        self._native = _C._Recorder(keep_full_tensors=self._keep)
        self.recording = None
        try:
            for name, m in _named_modules(self._module):
                self._handles.append(m.register_forward_pre_hook(self._pre_hook(name)))
                self._handles.append(m.register_forward_hook(self._hook(name)))
            for name, p in self._parameters:
                self._taps.append(self._native.tap_parameter(name, p))
        except BaseException:
            self._detach()
            self._native = None
            raise
        return self

    def _detach(self):
        for handle in self._handles:
            handle.remove()
        self._handles, self._taps = [], []

    def __exit__(self, kind, _value, _traceback):
        try:
            if kind is None:
                for name, p in self._parameters:
                    if p.grad is not None:
                        self._native.record_accumulated(name, p)
                self._native.check()
                self.recording = Recording(self._native.snapshot())
        finally:
            self._detach()
            self._native = None
        return False


class OperatorDivergence(_Result):
    """Two operator recordings compared: first_outputs_differ (the first call whose inputs
    matched and whose outputs differ: the nondeterministic operator, with its op and module),
    first_inputs_differ, entered_after, misaligned_at, summary (one line per finding)."""

    def __bool__(self):
        return bool(self.diverged)


def first_operator_divergence(a_path, b_path):
    """Compares two operator recordings (files); an ``OperatorDivergence``."""
    return OperatorDivergence(_C._first_operator_divergence(os.fspath(a_path), os.fspath(b_path)))


class OperatorRecorder:
    """Records every ATen operator call made in the block to ``path`` (see the module's
    docstring).

    ``module``: a ``torch.nn.Module`` whose submodules label the calls made in their forward
    (default: none; every call is labelled ``label``). ``flush_every``: completed calls between
    flushes (>= 1). ``rank``: written in the header (default: $RANK, else 0). ``row_window``:
    ``(rows, begin, end)`` digests only those rows of tensors with a dimension of ``rows``.
    """

    def __init__(self, path, *, module=None, label="program", flush_every=256, rank=None,
                 row_window=None):
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, not {type(module).__name__}")
        self._path = os.fspath(path)
        self._module = module
        self._label = str(label)
        self._flush_every = int(flush_every)
        self._rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        self._window = tuple(int(v) for v in row_window) if row_window is not None else None
        self._native = None
        self._scopes = []
        self._handles = []

    def _open(self, label):
        self._scopes.append(self._native.open_scope(label))

    def _close_top(self):
        if len(self._scopes) > 1:  # the block's own scope closes last
            self._scopes.pop().close()

    class _Scope:
        def __init__(self, recorder, label):
            self._recorder, self._label = recorder, label

        def __enter__(self):
            self._recorder._open(self._label)
            return self

        def __exit__(self, *_):
            self._recorder._close_top()
            return False

    def scope(self, label):
        """``with recorder.scope("loss"):`` labels the calls made in the block."""
        if self._native is None:
            raise RuntimeError("the OperatorRecorder is not recording (use it in a with block)")
        return OperatorRecorder._Scope(self, str(label))

    def __enter__(self):
        if self._native is not None:
            raise RuntimeError("this OperatorRecorder is already recording")
        self._native = _C._OperatorRecorder.create(self._path, flush_every=self._flush_every,
                                                   rank=self._rank, row_window=self._window)
        self._open(self._label)
        if self._module is not None:
            for name, m in _named_modules(self._module):
                self._handles.append(m.register_forward_pre_hook(
                    lambda _m, _a, name=name: self._open(name)))
                self._handles.append(m.register_forward_hook(
                    lambda _m, _a, _o: self._close_top()))
        return self

    @property
    def recorded(self):
        """Calls recorded so far."""
        return self._native.recorded if self._native is not None else 0

    def __exit__(self, kind, _value, _traceback):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        while self._scopes:
            self._scopes.pop().close()
        native, self._native = self._native, None
        if kind is None:
            native.close()
        else:
            try:
                native.close()
            except Exception:  # noqa: BLE001  (the block's own exception is the one to see)
                pass
        return False
