"""The base of errors caused by the user's input (a file, a name, an option, missing weights).

The CLI prints these as one line naming what to fix; any other exception is a bug and keeps its
traceback."""


class UserError(Exception):
    """Bad input: the message is one line naming the file/field and the fix."""
