"""Deterministic mode and the execution-context record, from Python (numerics/deterministic_mode.h
and numerics/execution_context.h in the C++ library).

- ``enforce()``: sets every LibTorch, cuBLAS and NCCL setting a process needs to compute the same
  bits every time, then verifies each; returns the settings in force. Call it first, before any
  CUDA work (an NCCL communicator reads its algorithm when it is made, and an older LibTorch's
  cuBLAS its workspace setting). CUBLAS_WORKSPACE_CONFIG is set only where the LibTorch in use
  demands it (``cublas_workspace_config_required`` in the result): a newer one gives every stream
  its own cuBLAS workspace, and the variable would only slow every cuBLAS call. A setting the
  program already made that contradicts the mode (warn-only deterministic algorithms, cuDNN
  benchmark on, another CUBLAS_WORKSPACE_CONFIG) raises ``lockstep.errors.FailedPreconditionError``
  naming the setting, its value and the value the mode needs; nothing is changed then.
- ``verify()``: raises ``FailedPreconditionError`` naming the first setting no longer in force.
- ``execution_context(**caller)``: what can make two matched runs differ outside their tensors
  (versions, devices, determinism settings, thread counts, and the caller's fields), as a dict
  ``{"stable", "volatile", "digest"}``; ``context_digest`` recomputes the digest of "stable",
  ``context_differences`` names the stable fields two records disagree on.

Example::

    import lockstep
    lockstep.determinism.enforce()          # first thing in the program
    model = build().cuda()
    ctx = lockstep.determinism.execution_context(seed="1234", world_size="2")
    print(ctx["digest"])
"""

import json
import os

from . import _C


def enforce():
    """Sets and verifies deterministic mode; returns the settings in force (a dict)."""
    settings = _C._enforce_deterministic_mode()
    # The C++ library set the process's environment; os.environ is Python's copy of it, read
    # once at start-up, so it is told too (for the program and for what it launches with env=).
    for variable, key in (("CUBLAS_WORKSPACE_CONFIG", "cublas_workspace_config"),
                          ("NCCL_ALGO", "nccl_algo"), ("NCCL_PROTO", "nccl_proto")):
        if settings[key] is not None:
            os.environ[variable] = settings[key]
    return settings


def verify():
    """Raises FailedPreconditionError naming the first setting of the mode not in force."""
    _C._verify_deterministic_mode()


def enforced():
    """Whether ``enforce()`` succeeded in this process."""
    return _C._deterministic_mode_enforced()


def execution_context(**caller):
    """The execution-context record (a dict); keyword arguments become ``stable.caller`` fields
    (their values as strings)."""
    return json.loads(_C._execution_context({str(k): str(v) for k, v in caller.items()}))


def context_digest(context):
    """The digest of a record's "stable" part, recomputed (32 hex digits)."""
    return _C._context_digest(json.dumps(context))


def context_differences(a, b):
    """The dotted paths of the stable fields whose values differ between two records, sorted."""
    return list(_C._context_differences(json.dumps(a), json.dumps(b)))
