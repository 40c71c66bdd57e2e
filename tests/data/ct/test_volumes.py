"""Issue 41 item 2: a NIfTI label map whose orientation header is mirrored against its image was
accepted and the organs were cut from the wrong side; a header without pixel spacing was read as
1 mm per pixel. Now the label map must share its image's affine (to AFFINE_TOLERANCE_MM), and an
unknown spacing is NaN (distance labels fall back to the 224 frame)."""
import nibabel as nib
import numpy as np
import pytest

from robustbench_fm.data.ct import layouts, phantoms
from robustbench_fm.data.ct.volumes import AFFINE_TOLERANCE_MM, check_same_space, load_ras
from robustbench_fm.data.files import DatasetError


@pytest.fixture
def word(tmp_path):
    root = phantoms.write_phantoms(tmp_path / "word", "word", n_subjects=1, seed=0)
    return layouts.list_volumes("word", root)[0]


def _resave(path, affine=None, pixdim=None):
    img = nib.load(str(path))
    data = np.asanyarray(img.dataobj)
    out = nib.Nifti1Image(data, img.affine if affine is None else affine, img.header.copy())
    if pixdim is not None:
        out.header["pixdim"][1:4] = pixdim
    out.to_filename(str(path))


def test_a_label_map_with_a_mirrored_header_is_refused_naming_both_files(word):
    before = layouts.load_labels(word)[0]
    mirrored = nib.load(str(word.labels)).affine.copy()
    mirrored[0, :] = -mirrored[0, :]  # the same voxels, the x axis pointing the other way
    _resave(word.labels, affine=mirrored)
    with pytest.raises(DatasetError) as err:
        layouts.load_labels(word)
    text = str(err.value)
    assert f"label map '{word.labels}' and its image '{word.image}' are not in one space" in text
    assert "axes LAS against the image's RAS" in text and "\n" not in text
    # the old reading: reoriented from its own header, the map is the mirror image of the right one
    assert np.array_equal(load_ras(word.labels, np.int16).astype(np.uint8), before[::-1])


def test_header_rounding_passes_and_a_shift_beyond_it_does_not(word):
    base = nib.load(str(word.image)).affine
    nudged = base.copy()
    nudged[:3, 3] += AFFINE_TOLERANCE_MM / 2
    _resave(word.labels, affine=nudged)
    check_same_space(word.image, word.labels)
    assert np.array_equal(layouts.load_labels(word)[0] > 0, load_ras(word.labels, np.int16) > 0)
    shifted = base.copy()
    shifted[1, 3] += 2.0
    _resave(word.labels, affine=shifted)
    with pytest.raises(DatasetError, match=r"the same axes \(RAS\), offset or scaled by up to 2 mm"):
        check_same_space(word.image, word.labels)


def test_a_header_without_pixel_spacing_gives_nan_not_1_mm(word):
    _, spacing = load_ras(word.image, spacing=True)
    assert np.isfinite(spacing).all() and spacing != (1.0, 1.0, 1.0)
    _resave(word.image, pixdim=[0.0, 0.0, 0.0])
    _resave(word.labels, affine=nib.load(str(word.image)).affine, pixdim=[0.0, 0.0, 0.0])
    assert nib.load(str(word.image)).header.get_zooms()[:3] == (1.0, 1.0, 1.0)  # what nibabel alone reports
    _, spacing = load_ras(word.image, spacing=True)
    assert np.isnan(spacing).all()
