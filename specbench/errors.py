"""The one exception type for user mistakes (kept free of heavy imports so any module can raise it)."""


class UserError(Exception):
    """A problem with what the user asked for; the CLI prints it as one line, no traceback, exit 2."""
