"""Name -> entry registries (encoders, datasets, stages) with close-name suggestions."""
from __future__ import annotations

import difflib
from typing import Generic, TypeVar

from .errors import UnknownName

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one ``kind``; an unknown name fails with one line suggesting the closest ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' registered twice")
        self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def values(self) -> list[T]:
        """The entries in the order they were registered."""
        return list(self._entries.values())

    def get(self, name: str) -> T:
        if name not in self._entries:
            close = difflib.get_close_matches(name, self._entries, n=3)
            hint = (f"did you mean {', '.join(close)}?" if close
                    else f"run 'python -m robustbench_fm list {self.kind}s'")
            raise UnknownName(f"unknown {self.kind} '{name}'; {hint}")
        return self._entries[name]
