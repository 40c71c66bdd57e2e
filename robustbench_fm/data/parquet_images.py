"""Images embedded in parquet files (Hugging Face snapshots such as PathoROB's): a manifest
``path`` is a locator ``"<parquet file relative to root>#<row index>"`` read with
:func:`read_parquet_image`. Imports no adapter, so the image readers and the registry can use it.

The prepared-image store (:mod:`robustbench_fm.data.prepared`) writes the same layout: an
``image`` column of encoded bytes, plus an ``error`` column saying why a row has no bytes (its
source could not be read), which the reader's error repeats."""
from __future__ import annotations

import os
from functools import lru_cache
from io import BytesIO
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from ..core.errors import InvalidSetting

LOCATOR_SEPARATOR = "#"


def parse_locator(locator: str) -> tuple[str, int]:
    """``"<file>#<row>"`` -> (file, row)."""
    file, sep, row = str(locator).rpartition(LOCATOR_SEPARATOR)
    if not sep or not file.endswith(".parquet") or not row.isdigit():
        raise InvalidSetting(f"'{locator}' is not a parquet locator; expected '<file>.parquet#<row index>'")
    return file, int(row)


@lru_cache(maxsize=4)
def _row_group_bounds(file: str, stamp: tuple = ()) -> np.ndarray:
    meta = pq.ParquetFile(file).metadata
    return np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])


@lru_cache(maxsize=2)
def _row_group_images(file: str, group: int, stamp: tuple = ()) -> list:
    return pq.ParquetFile(file).read_row_group(group, columns=["image"]).column("image").to_pylist()


def read_parquet_image(image_root: str | Path, row: dict) -> Image.Image:
    """The image a manifest row's parquet locator points at, decoded eagerly (an extraction
    ``reader(image_root, row)``). The last two row groups read stay in memory, so visiting rows
    in file order reads each group once."""
    file, index = parse_locator(row["path"])
    full = str(Path(image_root) / file)
    st = os.stat(full)
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)  # a rewritten file is read again, not from the caches
    bounds = _row_group_bounds(full, stamp)
    if index >= bounds[-1]:
        raise InvalidSetting(f"{full}: row {index} past the file's {bounds[-1]} rows; rebuild the manifest")
    group = int(np.searchsorted(bounds, index, side="right") - 1)
    cell = _row_group_images(full, group, stamp)[index - bounds[group]]
    data = cell["bytes"] if isinstance(cell, dict) else cell
    if not data and "error" in pq.ParquetFile(full).schema_arrow.names:
        error = pq.ParquetFile(full).read_row_group(group, columns=["error"]).column("error")
        raise InvalidSetting(f"{full}: row {index} holds no image: {error[index - bounds[group]].as_py() or 'empty'}")
    if not data:
        raise InvalidSetting(f"{full}: row {index} has no embedded image bytes; use the HF parquet snapshot, "
                             "whose 'image' column embeds each tile")
    with Image.open(BytesIO(data)) as im:
        im.load()
        return im
