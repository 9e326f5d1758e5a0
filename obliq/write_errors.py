"""A write that failed, named in one line: :class:`WriteError` for a file that could not be written (a full
disk, a used-up quota, the process's file-size limit, a read-only or forbidden folder), and how the file is
found when the error itself does not name it:

- a library's writer that reports the failure as an error of its own: safetensors' ``… (os error 27)``, torch's
  zip writer's ``RuntimeError`` (``[enforce fail at inline_container.cc] … unexpected pos``), which names no
  cause: the cause is then read off the disk (:func:`hidden_write_errno`);
- Python's ``write`` on an open file, whose ``OSError`` carries no file name (``[Errno 27] File too large``):
  the file is the one open for writing in the innermost frame of the traceback (:func:`named_write_error`,
  which :func:`obliq.errors.user_errors` applies to every command).

:func:`obliq.files.publish` (and so every atomic writer) turns such failures inside its block into a
:class:`WriteError` naming its path.
"""

from __future__ import annotations

import errno
import io
import os
import re
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class WriteError(OSError):
    """A file or folder that could not be written (disk full, a read-only or forbidden folder), named in one
    line; ``errno`` is the cause's. Whatever was at the path before is left as it was (:func:`publish`)."""

    def __str__(self) -> str:
        return str(self.args[-1])


WRITE_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is too large for the file system",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "no permission to write there",
    errno.EPERM: "no permission to write there",
}
"""What a failed write's errno means, for :func:`write_failed`; the ones that only a write raises (all but the
permissions, :data:`ONLY_WRITES`) make any error inside :func:`publish`'s block a write error."""

ONLY_WRITES = set(WRITE_CAUSES) - {errno.EACCES, errno.EPERM}
"""The errnos only a write raises: a permission error inside a writing block may be an input's."""


def file_size_limit() -> int | None:
    """This process's file-size limit in bytes (``ulimit -f``, ``RLIMIT_FSIZE``), or None when there is none."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def why_not_written(code: int | None, fallback: str = "") -> str:
    """The cause of a failed write with errno ``code`` in words; a file too large names the process's
    file-size limit when there is one (the usual cause: a file system's own limit is rarely reached)."""
    limit = file_size_limit()
    if code == errno.EFBIG and limit is not None:
        return f"larger than this process's file-size limit of {limit:,} bytes, ulimit -f"
    return WRITE_CAUSES.get(code) or fallback or f"errno {code}"


def write_failed(path: str | os.PathLike, err: OSError) -> WriteError:
    """The one-line error for ``path`` that could not be written because of ``err``."""
    why = why_not_written(err.errno, err.strerror or str(err))
    return WriteError(err.errno, f"{path}: could not be written ({why}); what was there before is left as it was")


@contextmanager
def writing(path: str | os.PathLike, written: str | os.PathLike | None = None) -> Iterator[None]:
    """Within the block, a failed write (:func:`hidden_write_errno`: an ``OSError`` of a write, a library's own
    error for one) becomes a :class:`WriteError` naming ``path``; other errors pass as they are. ``written``:
    where the block writes, when not ``path`` itself (a temporary file that is renamed to it)."""
    try:
        yield
    except Exception as err:
        code = hidden_write_errno(err, Path(written if written is not None else path))
        if isinstance(err, WriteError) or code is None:
            raise
        raise write_failed(path, err if isinstance(err, OSError) else OSError(code, os.strerror(code))) from None


def hidden_write_errno(err: BaseException, written: Path) -> int | None:
    """The errno of the failed write behind ``err`` (one of :data:`ONLY_WRITES`), or None when ``err`` is no
    failed write: an ``OSError``'s own; the ``(os error N)`` of a library's message (safetensors); for torch's
    zip writer (``inline_container.cc``, no cause given), the cause found on disk: a file at ``written`` (or
    under it) that reached the process's file-size limit (EFBIG), or no free space left beside it (ENOSPC)."""
    if isinstance(err, OSError):
        return err.errno if err.errno in ONLY_WRITES else None
    found = re.search(r"\(os error (\d+)\)", str(err))
    if found:
        return int(found[1]) if int(found[1]) in ONLY_WRITES else None
    if not (isinstance(err, RuntimeError) and "inline_container" in str(err)):
        return None
    limit = file_size_limit()
    files = [written] if written.is_file() else [f for f in written.rglob("*") if f.is_file()]
    if limit is not None and any(f.stat().st_size >= limit for f in files if f.exists()):
        return errno.EFBIG
    folder = written if written.is_dir() else written.parent
    if folder.is_dir() and os.statvfs(folder).f_bavail == 0:
        return errno.ENOSPC
    return None


def _file_being_written(err: BaseException) -> str | None:
    """The name of the file open for writing in the innermost frame of ``err``'s traceback that holds one
    (the file a bare ``write`` failed on), or None."""
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            name, mode = getattr(value, "name", None), str(getattr(value, "mode", ""))
            if isinstance(value, io.IOBase) and isinstance(name, str) and not name.startswith("<"):
                if any(c in mode for c in "wax+"):
                    return name
    return None


def named_write_error(err: BaseException) -> WriteError | None:
    """``err`` as a :class:`WriteError` naming its file, when it is a failed write (:data:`ONLY_WRITES`) whose
    ``OSError`` names none (``[Errno 27] File too large`` from a ``write`` call) and the file open for writing
    is found in its traceback; None otherwise."""
    if not isinstance(err, OSError) or isinstance(err, WriteError) or err.errno not in ONLY_WRITES:
        return None
    name = err.filename or _file_being_written(err)
    if name is None:
        return None
    return WriteError(err.errno, f"{name}: could not be written ({why_not_written(err.errno, err.strerror)})")
