"""The exceptions lockstep raises: one per absl status code, each carrying it as ``code``.

Bad arguments (INVALID_ARGUMENT, OUT_OF_RANGE) are ``ValueError`` subclasses; every other failure
is a ``LockstepError``, a ``RuntimeError``. The message is the C++ library's, unchanged.
"""


class _Coded:
    """Mixin: the status code (``"DEADLINE_EXCEEDED"``) beside the message."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class LockstepError(_Coded, RuntimeError):
    """A failure that is not the caller's argument: see the subclasses."""


class InvalidArgumentError(_Coded, ValueError):
    """An argument is wrong (the message names the value and the limit)."""


class OutOfRangeError(_Coded, ValueError):
    """An argument is outside the range the operation accepts."""


class FailedPreconditionError(LockstepError):
    """The object is not in a state for this call (a scope open, a communicator failed, ...)."""


class DeadlineExceededError(LockstepError):
    """A peer did not arrive within the timeout."""


class UnavailableError(LockstepError):
    """A peer is gone."""


class AbortedError(LockstepError):
    """Another replica failed; the message names it and its error."""


class DataLossError(LockstepError):
    """Saved bytes are corrupt or truncated."""


class NotFoundError(LockstepError):
    """A named thing (a stream, a tensor) does not exist."""


class AlreadyExistsError(LockstepError):
    """A name or a seed is in use already."""


class ResourceExhaustedError(LockstepError):
    """A limit (memory, a count) would be exceeded."""


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "OUT_OF_RANGE": OutOfRangeError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "UNAVAILABLE": UnavailableError,
    "ABORTED": AbortedError,
    "DATA_LOSS": DataLossError,
    "NOT_FOUND": NotFoundError,
    "ALREADY_EXISTS": AlreadyExistsError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
}


def error_type(code):
    """The exception class of a status code's name (the C++ boundary's lookup)."""
    return _BY_CODE.get(code, LockstepError)
