"""The variability checks for any PyTorch program (numerics/repeatability.h and
numerics/variability_evidence.h in the C++ library; qualify runs the same checks on its
reference model and writes the same evidence).

- ``repeatability(step, model)``: runs ``step`` (forward and backward of a fixed batch, as many
  backwards as the program's step makes, no optimizer update) three times — cold, warm1, warm2 —
  from the same RNG state and with the gradients cleared, each pass recorded module by module,
  and compares outputs and gradients pass to pass (bitwise by default). A cold pass that differs
  shows state that warms up; warm passes that differ show nondeterminism, localized to the first
  module and, per parameter, to a backward's contribution or the accumulation.
- The actors check: ``save_state`` once, then two fresh processes each ``run_actor`` (load the
  state, record their inventory, execution context, outputs and gradients), and
  ``compare_actors``: equal inventories, equal contexts (else the differing fields named), and
  bit-identical outputs and gradients (else the first divergence). ``python -m lockstep.verify``
  runs all of it over a program.

Before each pass the harness restores the default CPU and CUDA generators; ``streams`` (a
lockstep.rng.RankStreams), Python's ``random`` and NumPy's global state are restored too.

Example::

    def step():
        for ids, targets in microbatches:              # three backwards, no optimizer step
            loss_fn(model(ids), targets).backward()
        return {"loss": loss.detach()}

    result = lockstep.variability.repeatability(step, model)
    assert result, result.detail
"""

import json
import os
import random
import secrets

import torch

from . import _C, determinism, numerics, replay
from .numerics import _Result
from .recording import ModuleRecorder, OperatorRecorder, Recording

# Records (the first, in execution order) whose tensors a recorded pass keeps, for the figures
# of the evidence (relative L2, tolerance ratio): every record of a small model; a bounded host
# copy of a large one's (a model at full size records thousands of activations per step; past
# this count the records keep their digests and summaries only).
KEEP_FULL_TENSORS = 1024


class CheckResult(_Result):
    """A check's outcome: ``passed``, ``detail`` (one line), ``evidence`` (every figure)."""

    def __bool__(self):
        return bool(self.passed)

    def __repr__(self):
        return f"<CheckResult {'PASS' if self.passed else 'FAIL'}: {self.detail}>"


def _named_outputs(outputs):
    if isinstance(outputs, torch.Tensor):
        return [("output", outputs.detach())]
    if isinstance(outputs, dict):
        return [(str(k), v.detach()) for k, v in outputs.items()]
    if isinstance(outputs, (list, tuple)):
        return [(str(k), v.detach()) for k, v in outputs]
    raise TypeError(f"the step returns a tensor, a dict or (name, tensor) pairs, not "
                    f"{type(outputs).__name__}")


def _trainable(model, parameters):
    if parameters is not None:
        return [(str(n), p) for n, p in parameters]
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class _Restorer:
    """Puts the program's generators back to their state at construction."""

    def __init__(self, streams):
        self._streams = streams
        self._streams_state = _C.capture_resume_state(streams) if streams is not None else None
        self._random = random.getstate()
        self._numpy = None
        try:
            import numpy
            self._numpy = numpy.random.get_state()
        except ImportError:
            pass

    def __call__(self):
        if self._streams is not None:
            _C.restore_resume_state(self._streams, self._streams_state)
        random.setstate(self._random)
        if self._numpy is not None:
            import numpy
            numpy.random.set_state(self._numpy)


def repeatability(step, model, *, parameters=None, streams=None, record=True,
                  keep_full_tensors=KEEP_FULL_TENSORS, atol=0.0, rtol=0.0, relative_l2=0.0,
                  nan_equal=True, bitwise=True):
    """The repeatability check of ``step`` on ``model`` (see the module's docstring); a
    ``CheckResult``. ``parameters``: the ``(name, tensor)`` leaves whose gradients are compared
    (default: ``model``'s trainable parameters). ``record``: record each pass module by module
    (the first ``keep_full_tensors`` records keep a host copy of their tensors, for the
    figures; the others their digests and summaries). The tolerance keywords
    are numerics.compare's; the default is bitwise."""
    return _repeatability(step, model, _trainable(model, parameters), streams, record,
                          keep_full_tensors, dict(atol=atol, rtol=rtol, relative_l2=relative_l2,
                                                  nan_equal=nan_equal, bitwise=bitwise))


def _repeatability(step, model, named, streams, record, keep_full_tensors, tolerance, last=None):
    """``repeatability``'s work; ``last`` (a dict), when given, receives the warm2 pass's
    ``outputs`` and ``recording`` (its gradients stay in the parameters' ``.grad``)."""
    restore = _Restorer(streams)

    def one_pass():
        restore()
        if not record:
            outputs, native = _named_outputs(step()), None
        else:
            with ModuleRecorder(model, keep_full_tensors=keep_full_tensors,
                                parameters=named) as recorder:
                outputs = _named_outputs(step())
            native = recorder.recording._native
        if last is not None:
            last.update(outputs=outputs, recording=native)
        return outputs, native

    return CheckResult(_C._run_repeatability(one_pass, named, **tolerance))


def _rank(rank):
    return replay.rank_and_world(rank, None)[0]


def _state_paths(directory, rank):
    base = os.path.join(os.fspath(directory), f"rank{rank}")
    return base + ".safetensors", base + ".inventory.json"


def save_state(directory, model, optimizer=None, *, streams=None, rank=None):
    """Saves this rank's state for the actors to load: ``model``'s parameters and buffers,
    ``optimizer``'s state, every stream of ``streams``, Python's ``random`` state (and NumPy's,
    where NumPy is installed), with its inventory beside it. ``directory`` is shared by the
    ranks (``rank<r>.*``); it is created."""
    rank = _rank(rank)
    os.makedirs(os.fspath(directory), exist_ok=True)
    state_path, inventory_path = _state_paths(directory, rank)
    generators = [("rng/python_random", replay.python_random_state())]
    try:
        generators.append(("rng/numpy_random", replay.numpy_random_state()))
    except ImportError:
        pass
    tensors = numerics.module_state(model, optimizer) + generators
    metadata = {}
    if streams is not None:
        metadata["lockstep.rng_streams"] = _C.capture_resume_state(streams).hex()
    numerics.write_safetensors(state_path, tensors, metadata)
    inventory = numerics.inventory(tensors[:len(tensors) - len(generators)])
    write_text(inventory_path, inventory.json())


def write_text(path, text):
    """Writes ``text`` to ``path`` atomically and durably (a temporary file beside it, replaced)."""
    # A new file under a random name (O_EXCL, which follows no link): nothing planted at a name
    # known in advance is written through or makes the write fail. Its mode is 0666 less umask.
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_state(directory, model, optimizer=None, *, streams=None, rank=None):
    """Loads what ``save_state`` saved into ``model``, ``optimizer`` and ``streams`` (and Python's
    and NumPy's generators); returns the names restored. Raises ``KeyError`` naming a parameter
    or buffer the file lacks."""
    state_path, _ = _state_paths(directory, _rank(rank))
    tensors, metadata = numerics.read_safetensors(state_path)
    saved = dict(tensors)
    restored = []
    with torch.no_grad():
        for name, target in model.state_dict(keep_vars=True).items():
            if name not in saved:
                raise KeyError(f"{state_path} has no '{name}'")
            target.copy_(saved[name])
            restored.append(name)
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                fields = {}
                for field in numerics._OPTIMIZER_FIELDS:
                    key = f"optimizer/{names[id(p)]}/{field}"
                    if key in saved:
                        value = saved[key].to(p.device)
                        fields[field] = (torch.tensor(float(value), dtype=torch.float32)
                                         if field == "step" else value.clone())
                        restored.append(key)
                if fields:
                    optimizer.state[p] = fields
    if streams is not None and "lockstep.rng_streams" in metadata:
        _C.restore_resume_state(streams, bytes.fromhex(metadata["lockstep.rng_streams"]))
        restored.append("rng/streams")
    if "rng/python_random" in saved:
        replay.restore_python_random(saved["rng/python_random"])
        restored.append("rng/python_random")
    if "rng/numpy_random" in saved:
        try:
            replay.restore_numpy_random(saved["rng/numpy_random"])
            restored.append("rng/numpy_random")
        except ImportError:
            pass
    return restored


def run_actor(directory, prefix, step, model, optimizer=None, *, streams=None, rank=None,
              caller=None, load=None, record_operators=True,
              keep_full_tensors=KEEP_FULL_TENSORS):
    """One actor: loads the state ``save_state`` saved under ``directory`` (``load``, a callable
    ``(directory, model, optimizer, streams, rank)``, replaces ``load_state``), then writes its
    evidence under ``prefix`` (``<prefix>.rank<r>.*``): inventory, execution context (``caller``
    fields added), what the load restored less than was saved, the step's outputs and gradients
    and its module recording; its repeatability check (``.repeatability.json``); and, with
    ``record_operators``, the step's operator recording (``.ops.jsonl``). ``keep_full_tensors``:
    as ``repeatability``'s. Returns the repeatability ``CheckResult``."""
    rank = _rank(rank)
    (load or load_state)(directory, model, optimizer, streams=streams, rank=rank)
    _, inventory_path = _state_paths(directory, rank)
    with open(inventory_path, encoding="utf-8") as f:
        saved_inventory = f.read()
    loaded = numerics.inventory(numerics.module_state(model, optimizer))
    saved_vs_loaded = list(_C._inventory_differences(saved_inventory, loaded.json()))
    context = determinism.execution_context(rank=rank, **(caller or {}))
    named = _trainable(model, None)
    restore = _Restorer(streams)
    # The warm2 pass's outputs, gradients and recording are the actor's evidence: the step is not
    # run again for it.
    last = {}
    result = _repeatability(step, model, named, streams, True, keep_full_tensors,
                            dict(bitwise=True, atol=0.0, rtol=0.0, relative_l2=0.0,
                                 nan_equal=True), last)
    base = f"{os.fspath(prefix)}.rank{rank}"
    write_text(base + ".repeatability.json", json.dumps(result.as_dict()))
    gradients = [(n, p.grad.detach()) for n, p in named if p.grad is not None]
    _C._write_actor_evidence(os.fspath(prefix), rank, loaded.json(), json.dumps(context),
                             saved_vs_loaded, last["outputs"], gradients, last["recording"])
    if record_operators:
        restore()
        for _, p in named:
            p.grad = None
        with OperatorRecorder(base + ".ops.jsonl", module=model, label="step", rank=rank):
            step()
    return result


def compare_actors(prefix_a, prefix_b, rank=0):
    """The actors check of ``rank`` from two actors' evidence (``run_actor``); a
    ``CheckResult``. Raises ``NotFoundError``/``InvalidArgumentError`` for missing or malformed
    evidence."""
    return CheckResult(_C._compare_actors(os.fspath(prefix_a), os.fspath(prefix_b), int(rank)))


__all__ = ["CheckResult", "Recording", "compare_actors", "load_state", "repeatability",
           "run_actor", "save_state"]
