"""Comparing the preprocessing a weights' config declares with the registry entry's."""
from __future__ import annotations

import math
from typing import Iterable

from ...core.errors import InvalidSetting
from ..spec import EncoderSpec

_TOL = 1e-4  # mean/std agreement between a weights' config and the spec


def values_close(a: Iterable[float], b: Iterable[float]) -> bool:
    """Equal within ``_TOL``; a single value stands for every channel."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) == 1 and len(b) > 1:
        a = a * len(b)
    if len(b) == 1 and len(a) > 1:
        b = b * len(a)
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=_TOL) for x, y in zip(a, b))


def raise_preprocess_mismatch(spec: EncoderSpec, source: str, diffs: list[str]) -> None:
    """Raise one line listing ``diffs`` between ``source`` and the entry (nothing when empty)."""
    if diffs:
        raise InvalidSetting(f"encoder '{spec.name}': preprocessing in {source} disagrees with the registry "
                             f"entry ({'; '.join(diffs)}); fix the entry or use matching weights")
