"""`UsageError`: a mistake in what the user asked for, reported as one line."""


class UsageError(ValueError):
    """A bad argument, file or run directory: the user can fix it, so the
    command line prints the message as one line instead of a traceback."""
