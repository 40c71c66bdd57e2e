"""Results of one stage: ``summary`` (one row per encoder × task × statistic set) and, for
per-sample methods, ``per_sample`` (one row per query/anchor)."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


def write_atomic(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A plain GitHub-markdown table (no extra dependency)."""
    def fmt(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else format(v, floatfmt)
        return str(v)
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


@dataclass
class Results:
    """What a stage returns; ``save(dir)`` writes summary/per-sample parquet and a markdown table."""

    summary: pd.DataFrame
    per_sample: pd.DataFrame | None = None
    params: dict = field(default_factory=dict)

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "summary.parquet", lambda p: self.summary.to_parquet(p, index=False))
        if self.per_sample is not None:
            write_atomic(directory / "per_sample.parquet",
                         lambda p: self.per_sample.to_parquet(p, index=False))
        write_atomic(directory / "summary.md", lambda p: Path(p).write_text(to_markdown(self.summary)))
        write_atomic(directory / "params.json",
                     lambda p: Path(p).write_text(json.dumps(self.params, indent=2, default=str)))
        return directory
