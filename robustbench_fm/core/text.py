"""Text helpers for one-line messages: an exception's or a value's text as one line, so an error
that quotes it (a cache file that is unreadable, a hub download that failed, a bad image) stays
the single line the user reads (``core.errors.UserError``'s contract)."""
from __future__ import annotations


def one_line(text: object, limit: int | None = None) -> str:
    """``str(text)`` with every run of whitespace (newlines, tabs) collapsed to one space and the
    ends stripped; with ``limit``, at most ``limit`` characters, a longer text cut to
    ``limit - 3`` and ``...`` appended."""
    s = " ".join(str(text).split())
    if limit is None or len(s) <= limit:
        return s
    if limit < 3:
        raise ValueError(f"one_line: limit must be >= 3 (room for '...'), got {limit}")
    return s[: limit - 3] + "..."
