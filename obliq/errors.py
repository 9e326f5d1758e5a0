"""User-facing errors: one line on stderr and exit status 2 instead of a traceback."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

USER_ERRORS = (ValueError, KeyError, FileNotFoundError, NotADirectoryError, PermissionError, FloatingPointError)
"""What bad input raises across obliq (RowError is a ValueError): file, line and field are in the message."""


@contextmanager
def user_errors():
    """Print a user error as ``error: <message>`` and exit with status 2; ``OBLIQ_DEBUG=1`` re-raises
    it with its traceback."""
    try:
        yield
    except USER_ERRORS as err:
        if os.environ.get("OBLIQ_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
