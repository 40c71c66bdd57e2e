"""A file whose EXIF orientation the readers now apply (issue 54 item 5) gets a new image identity, so its
vector embedded before (of the unturned pixels) is not served; every other file keeps the identity the
earlier code gave it, so its vectors are (robustbench_fm/features/store.py: image_ids, FileHashes)."""
import hashlib

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from PIL import Image

from robustbench_fm.features.store import FileHashes, _pixel_part, image_ids


def _jpeg(path, orientation=None):
    im = Image.fromarray(np.arange(48 * 32, dtype=np.uint8).reshape(32, 48))
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    im.save(path, exif=exif)


def _old_id(root, manifest, row):
    """The identity ae38a5a's image_ids gave: the file's SHA-256 and the row's pixel part, nothing else."""
    digest = hashlib.sha256((root / manifest["path"].iloc[row]).read_bytes()).hexdigest()
    return hashlib.sha256(f"{digest}\x1f{_pixel_part(manifest)[row]}".encode()).hexdigest()[:32]


def test_only_a_turned_file_changes_identity_and_the_memo_keeps_its_orientation(tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    _jpeg(root / "plain.jpg")
    _jpeg(root / "upright.jpg", orientation=1)
    _jpeg(root / "turned.jpg", orientation=6)
    manifest = pd.DataFrame({"sample_id": ["a", "b", "c"], "path": ["plain.jpg", "upright.jpg", "turned.jpg"]})
    hashes = FileHashes(tmp_path / "cache")
    ids = image_ids(manifest, root, hashes)
    assert ids[0] == _old_id(root, manifest, 0) and ids[1] == _old_id(root, manifest, 1)  # vectors kept
    assert ids[2] != _old_id(root, manifest, 2)  # embedded again, upright
    hashes.save()
    table = pq.read_table(tmp_path / "cache" / "_files" / "hashes.parquet").to_pandas()
    assert sorted(table["orientation"].tolist()) == [1, 1, 6]
    again = FileHashes(tmp_path / "cache")  # read back: no header is opened again, the same identities
    assert (image_ids(manifest, root, again) == ids).all() and again._new == 0


def test_a_memo_written_before_the_orientation_column_is_asked_once(tmp_path):
    root = tmp_path / "imgs"
    root.mkdir()
    _jpeg(root / "turned.jpg", orientation=8)
    manifest = pd.DataFrame({"sample_id": ["a"], "path": ["turned.jpg"]})
    hashes = FileHashes(tmp_path / "cache")
    first = image_ids(manifest, root, hashes)
    hashes.save()
    path = tmp_path / "cache" / "_files" / "hashes.parquet"
    old = pq.read_table(path).drop(["orientation"])  # as the earlier code wrote it
    pq.write_table(old, path)
    again = FileHashes(tmp_path / "cache")
    assert (image_ids(manifest, root, again) == first).all() and again._new == 1  # the header read once
