"""PathoROB dataset roots in the real layout: the real metadata CSVs under ``metadata/`` and
synthetic tiles in HF parquet shards ``data/train-0000k-of-0000n.parquet`` (``image`` as the HF
Image struct {bytes, path}, plus the metadata columns), rows shuffled across shards so the
adapter's join is exercised. Tile ``t`` of a shard is a 4×4 PNG of grey level ``t % 256``
where ``t`` is the tile's row in its metadata file."""
from io import BytesIO
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

METADATA = Path(__file__).resolve().parents[1] / "reference" / "pathorob" / "metadata"
_PNGS = []
for _g in range(256):
    _buf = BytesIO()
    Image.fromarray(np.full((4, 4), _g, dtype=np.uint8)).save(_buf, format="PNG")
    _PNGS.append(_buf.getvalue())


def grey_of(row_in_metadata: int) -> int:
    return row_in_metadata % 256


def write_snapshot(root: Path, tiles: pd.DataFrame, n_shards: int = 3, seed: int = 0) -> None:
    """``tiles`` (metadata columns, one row per distinct tile) written as shuffled parquet shards."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(seed).permutation(len(tiles))
    for k, part in enumerate(np.array_split(order, n_shards)):
        chunk = tiles.iloc[part]
        images = [{"bytes": _PNGS[grey_of(i)], "path": f"{s}-{p}.png"}
                  for i, s, p in zip(part, chunk["slide_id"], chunk["patch_id"])]
        table = pa.table({"image": pa.array(images, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                          **{c: pa.array(chunk[c].tolist()) for c in ("slide_id", "patch_id", "medical_center",
                                                                      "biological_class")}})
        pq.write_table(table, root / "data" / f"train-{k:05d}-of-{n_shards:05d}.parquet", row_group_size=4096)


def copy_metadata(root: Path, names: list[str]) -> None:
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / "metadata" / name).write_bytes((METADATA / name).read_bytes())


def synthetic_tcga_2x2(meta_4x4: pd.DataFrame) -> pd.DataFrame:
    """A small stand-in for ``tcga_2x2.csv`` (absent from the reference mirror) in its columns:
    three quartets of 2 classes x 2 centres x 3 tiles built from real TCGA-4x4 tiles, two
    quartets sharing tiles (Asterand breast in q0 and q1, Roswell Park colon in q0 and q2)."""
    ident = meta_4x4[meta_4x4["subset"] == "ID"]
    quartets = [("q0", ("Breast_invasive_carcinoma", "Colon_adenocarcinoma"), ("Asterand", "Roswell Park")),
                ("q1", ("Breast_invasive_carcinoma", "Lung_adenocarcinoma"), ("Asterand", "Christiana Healthcare")),
                ("q2", ("Lung_squamous_cell_carcinoma", "Colon_adenocarcinoma"),
                 ("University of Pittsburgh", "Roswell Park"))]
    parts = []
    for name, classes, centres in quartets:
        for cls in classes:
            for centre in centres:
                cell = ident[(ident["biological_class"] == cls) & (ident["medical_center"] == centre)].head(3)
                parts.append(cell.assign(subset=name))
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="session")
def pathorob_roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pathorob")
    roots = {}
    for key, files in (("camelyon", ["camelyon.csv"]), ("tcga", ["tcga_4x4.csv"]),
                       ("tolkach_esca", ["tolkach_esca.csv", "tolkach_esca_reduced.csv"])):
        root = base / key
        copy_metadata(root, files)
        write_snapshot(root, pd.read_csv(METADATA / files[0], dtype=str))
        roots[key] = root
    synthetic_tcga_2x2(pd.read_csv(METADATA / "tcga_4x4.csv", dtype=str)).to_csv(
        roots["tcga"] / "metadata" / "tcga_2x2.csv", index=False)
    return roots
