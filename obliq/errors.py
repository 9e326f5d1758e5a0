"""User-facing errors: one line on stderr and exit status 2 instead of a traceback."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

USER_ERRORS = (ValueError, KeyError, OSError, FloatingPointError)
"""What bad input raises across obliq (RowError is a ValueError): file, line and field are in the message.
OSError covers missing files and folders, permissions and a hub id that cannot be reached offline."""


def _user_error(err: BaseException) -> BaseException | None:
    """``err`` or the first user error it was raised while handling (a library's clean-up can fail
    after ours and hide it: Lightning's teardown after a failed resume, for one)."""
    seen = set()
    while err is not None and id(err) not in seen:
        # Lightning's MisconfigurationException (a bad trainer setting, e.g. max_steps -5) is the user's too
        if isinstance(err, USER_ERRORS) or type(err).__name__ == "MisconfigurationException":
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@contextmanager
def user_errors():
    """Print a user error as ``error: <message>`` and exit with status 2; ``OBLIQ_DEBUG=1`` re-raises
    it with its traceback."""
    try:
        yield
    except Exception as raised:
        err = _user_error(raised)
        if err is None or os.environ.get("OBLIQ_DEBUG"):
            raise
        from obliq.write_errors import named_write_error

        after = "" if err is raised else f" (then, while stopping: {type(raised).__name__}: {raised})"
        err = named_write_error(err) or err  # `[Errno 27] File too large` from a write: its file named
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}{after}", file=sys.stderr)
        raise SystemExit(2) from None


def weights_only_refusal(err: BaseException, source: object) -> ValueError:
    """The one-line error for a file that ``torch.load(weights_only=True)`` refused (a pickle that holds
    more than plain tensors): obliq never retries with ``weights_only=False``, whatever torch suggests."""
    import re

    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
    what = f"it names {found[1]!r}" if found else "not plain tensors"
    return ValueError(
        f"{source}: a pickle that holds more than weights ({what}): obliq reads weights as data only "
        "(weights_only=True) and never runs a file's code; use a safetensors copy made where the file is trusted"
    )


def check_int(name: str, value, minimum: int) -> None:
    """Raise ``ValueError("<name>: …")`` unless ``value`` is an integer ≥ ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
