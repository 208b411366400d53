"""The exceptions of topk.

Every error topk raises on purpose derives from :class:`TopkError` and from
the builtin a caller would catch anyway, and carries the Rust message, which
names the offending value, id, row, file or offset::

    TopkError
    ├── InvalidInputError (ValueError)  bad dimensions, K = 0, NaN/Inf, duplicate ids, ...
    ├── IndexFileError (OSError)         missing, unreadable, corrupt or truncated files
    └── DeviceError (RuntimeError)       the GPU or another backend failed or is unavailable

An input of the wrong kind (a dtype that is not floating point, an unknown
option) is a plain ``TypeError``, as in numpy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DeviceError", "IndexFileError", "InvalidInputError", "TopkError"]


class TopkError(Exception):
    """Base class of every error topk raises on purpose."""


class InvalidInputError(TopkError, ValueError):
    """An input breaks a rule: dimension, K, NaN/Inf, ids (docs/CONTRACTS.md §4, §10)."""


class IndexFileError(TopkError, OSError):
    """An index file cannot be written, read, or trusted.

    ``filename`` is the file; ``errno`` is set when the operating system
    refused the operation (``errno.ENOENT`` for a missing file), ``None`` when
    the file was read but its bytes are wrong (bad magic, checksum, truncated).
    ``str(error)`` is the Rust message, which names the file and the offset.
    """

    def __str__(self) -> str:
        # OSError would rebuild the text from errno and filename; the Rust
        # message already says all of it.
        if len(self.args) == 1:
            return str(self.args[0])
        return super().__str__()

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError pickles errno and filename only when its constructor set
        # them; here they are set afterwards, so they travel in the state
        # (a Ray shard's error reaches the driver whole).
        state = {**self.__dict__, "errno": self.errno, "filename": self.filename}
        return (type(self), self.args, state)


class DeviceError(TopkError, RuntimeError):
    """A backend could not run: the device failed or this build or machine lacks it."""
