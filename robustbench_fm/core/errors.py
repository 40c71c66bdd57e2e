"""The errors caused by the user's input (a file, a name, an option, missing weights).

The command line prints a :class:`UserError` as one line naming what to fix; any other exception
is a bug: one line saying so, with the log file that holds its traceback (``debug=true`` prints
it). A check that used to raise ``ValueError`` / ``KeyError`` / ``FileNotFoundError`` raises the
matching subclass below, so code that catches the built-in type keeps working."""


class UserError(Exception):
    """Bad input: the message is one line naming the file/field and the fix."""


class InvalidSetting(UserError, ValueError):
    """A setting, option or input value that cannot be used (one line naming it and the fix)."""


class UnknownName(UserError, KeyError):
    """An unknown registered name (encoder, dataset, stage, table): one line with the close ones.
    ``str()`` is the message itself (a ``KeyError`` would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingInput(UserError, FileNotFoundError):
    """A file or folder the user named (or a setting points at) does not exist."""


def message(exc: BaseException) -> str:
    """The one-line text of an error (a ``KeyError``'s message without the quotes ``str()`` adds)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    return " ".join(str(text).split())
