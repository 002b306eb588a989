"""Error types for problems the user caused. The CLI turns them into one line and exit code 2."""


class LlmplanError(Exception):
    """Base class of every user-facing error."""


class SpecError(LlmplanError):
    """A model, hardware, budget or calibration spec is malformed or unknown."""


class UsageError(LlmplanError):
    """Arguments that are individually valid but cannot be combined (e.g. TP > heads)."""


class Interrupted(LlmplanError):
    """Ctrl-C, with what the user should know (where the finished work is): exit code 130."""

    exit_code = 130


def first_line(err: BaseException) -> str:
    """An exception's first line for a one-line message ('' when it has no message)."""
    lines = str(err).splitlines()
    return lines[0] if lines else ""
