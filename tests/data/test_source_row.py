"""Issue 54 item 13: an unreadable image of a ``dataset=csv`` run is named by its CSV row and path,
also when the other rows are already cached (extraction then reads only the rows no cache holds,
whose sample_ids are image ids): before, "manifest row 0, sample_id '21bf9f9b…'" for CSV row 7."""
from __future__ import annotations

import numpy as np
import pytest
from feature_fixtures import tiny_encoder
from PIL import Image

from robustbench_fm import data
from robustbench_fm.data import prepared
from robustbench_fm.features.embed import Embedder
from robustbench_fm.features.engine.rows import ImageReadError
from robustbench_fm.features.options import ExtractOptions


def _images(root, n):
    rng = np.random.default_rng(0)
    (root / "imgs").mkdir(parents=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / "imgs" / f"{i}.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / "imgs" / "tiny.png")  # under 16 px: unreadable


def _csv(root, name, paths):
    path = root / name
    path.write_text("path,m\n" + "".join(f"{p},{i % 2}\n" for i, p in enumerate(paths)))
    return path


@pytest.mark.parametrize("resolution", [None, 32])
def test_the_bad_image_is_named_by_its_csv_row_when_the_other_rows_are_cached(tmp_path, resolution):
    root = tmp_path / "data"
    _images(root, 8)
    service = Embedder(tmp_path / "cache", ExtractOptions(device="cpu", batch_size=4, shard_size=4),
                       resolution=resolution)
    first = _csv(root, "first.csv", [f"imgs/{i}.png" for i in range(7)])
    service.embed(data.build_manifest("csv", root, manifest=first, finding_columns=["m"]), root, tiny_encoder())
    labels = _csv(root, "labels.csv", [f"imgs/{i}.png" for i in range(7)] + ["imgs/tiny.png", "imgs/7.png"])
    manifest = data.build_manifest("csv", root, manifest=labels, finding_columns=["m"])
    error = prepared.PreparedImageError if resolution else ImageReadError
    with pytest.raises(error) as err:
        service.embed(manifest, root, tiny_encoder())
    text = str(err.value)
    assert text.startswith(f"{root / 'imgs' / 'tiny.png'} ({labels} row 7): cannot read image: "), text
    assert "manifest row" not in text and "\n" not in text
