"""Error types for problems the user caused. The CLI turns them into one line and exit code 2."""


class LlmplanError(Exception):
    """Base class of every user-facing error."""


class SpecError(LlmplanError):
    """A model, hardware, budget or calibration spec is malformed or unknown."""


class UsageError(LlmplanError):
    """Arguments that are individually valid but cannot be combined (e.g. TP > heads).

    ``fields`` names the inputs the message speaks of as the library names them (``tp``,
    ``num_speculative_tokens``); the CLI says each as its flag (``--tp``), a budget file as
    its key (``flagged``)."""

    def __init__(self, message: str = "", *, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = fields


def said_as(err: BaseException, name_of) -> str:
    """The message with each field it names (``UsageError.fields``) said as ``name_of(field)``
    says it."""
    import re

    text = str(err)
    for f in getattr(err, "fields", ()):
        text = re.sub(rf"(?<![-\w]){re.escape(f)}(?![-\w])", name_of(f), text)
    return text


def flagged(err: BaseException) -> str:
    """The message with each field it names said as the CLI's flag: "tp 3 does not divide"
    -> "--tp 3 does not divide"."""
    return said_as(err, lambda f: "--" + f.replace("_", "-"))


class Interrupted(LlmplanError):
    """Ctrl-C, with what the user should know (where the finished work is): exit code 130."""

    exit_code = 130


def first_line(err: BaseException) -> str:
    """An exception's first line for a one-line message ('' when it has no message)."""
    lines = str(err).splitlines()
    return lines[0] if lines else ""
