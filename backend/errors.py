"""One family for errors in what a user asked for, raised by the loader, planner, export and engine config.

UserError is a ValueError, so `except ValueError` keeps catching it; its message says what was wrong,
what is allowed and what to do instead, and front ends show that message alone (no type, no traceback).
Anything else that escapes is a bug or an environment failure and is shown with its type.
"""

from __future__ import annotations


class UserError(ValueError):
    """A value out of range, an unknown name, or a combination that cannot work."""


class ModelNotFound(UserError, FileNotFoundError):
    """A model path that does not exist or is not a model (also a FileNotFoundError, for OSError handlers)."""


class Unsupported(UserError):
    """A valid request that this engine or exporter cannot serve; the message names an alternative."""
