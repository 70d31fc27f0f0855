"""The base of the errors that describe what a user gave (a model file, an option, the
environment) rather than a fault in Fermium: the `fermium` command prints their message as one
line, `error: ...`, and exits with status 2, as it does for a bad option, instead of a traceback."""
from __future__ import annotations

EXIT_BAD_INPUT = 2   # the status of a usage error (click's), for bad input of any kind


class UserError(Exception):
    """Mixed into an error class whose message alone tells the user what to fix."""
