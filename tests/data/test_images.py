"""read_image decodes every format to the exact documented 8-bit values (robustbench_fm/data/images.py)."""
import h5py
import numpy as np
import pytest
from fixtures_images import write_dicom
from PIL import Image

from robustbench_fm.data import images
from robustbench_fm.data.images import read_image, read_mask
from robustbench_fm.features.engine.rows import default_reader


def pixels(im):
    return np.asarray(im).tolist()


def test_dicom_monochrome2_is_stretched_and_monochrome1_inverted(tmp_path):
    raw = np.array([[0, 100], [200, 400]], dtype=np.uint16)
    write_dicom(tmp_path / "m2.dcm", raw, "MONOCHROME2")
    write_dicom(tmp_path / "m1.dicom", raw, "MONOCHROME1")
    m2 = read_image(tmp_path, {"path": "m2.dcm"})
    m1 = read_image(tmp_path, {"path": "m1.dicom"})
    assert m2.mode == m1.mode == "L"
    assert pixels(m2) == [[0, 64], [128, 255]]  # 100*255/400 = 63.75, 200*255/400 = 127.5 -> 128
    assert pixels(m1) == [[255, 191], [127, 0]]


def test_dicom_window_is_applied_before_the_stretch(tmp_path):
    raw = np.array([[0, 1000, 1250], [1500, 1750, 3000]], dtype=np.uint16)
    write_dicom(tmp_path / "w.dcm", raw, window=(1500.5, 1001))  # linear window over [1000, 2000]
    assert pixels(read_image(tmp_path, {"path": "w.dcm"})) == [[0, 0, 64], [128, 191, 255]]


def test_dicom_modality_rescale_comes_before_the_window(tmp_path):
    raw = np.array([[50, 550, 1050]], dtype=np.uint16)  # x2 - 100 -> 0, 1000, 2000
    write_dicom(tmp_path / "r.dcm", raw, window=(1000.5, 1001), rescale=(2.0, -100.0))
    assert pixels(read_image(tmp_path, {"path": "r.dcm"})) == [[0, 128, 255]]  # not [0, 13, 140]


def test_dicom_voi_lut_sequence_maps_values(tmp_path):
    raw = np.array([[0, 1, 2, 3, 5]], dtype=np.uint16)
    write_dicom(tmp_path / "lut.dcm", raw, voi_lut=(0, [0, 10, 20, 40], 16))
    assert pixels(read_image(tmp_path, {"path": "lut.dcm"})) == [[0, 64, 128, 255, 255]]


def test_16_bit_png_is_stretched_and_8_bit_png_unchanged(tmp_path):
    Image.fromarray(np.array([[0, 1024], [2048, 4095]], dtype=np.uint16)).save(tmp_path / "16.png")
    with Image.open(tmp_path / "16.png") as check:
        assert check.mode.startswith("I")  # really stored with 16 bits
    im = read_image(tmp_path, {"path": "16.png"})
    assert im.mode == "L" and pixels(im) == [[0, 64], [128, 255]]
    Image.fromarray(np.array([[3, 7], [11, 250]], dtype=np.uint8)).save(tmp_path / "8.png")
    assert pixels(read_image(tmp_path, {"path": "8.png"})) == [[3, 7], [11, 250]]


def test_alpha_and_palette_become_rgb(tmp_path):
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 17
    Image.fromarray(rgba).save(tmp_path / "a.png")
    im = read_image(tmp_path, {"path": "a.png"})
    assert im.mode == "RGB" and pixels(im)[0][0] == [200, 0, 0]
    Image.fromarray(np.full((2, 2, 3), 90, np.uint8)).convert("P", palette=Image.Palette.ADAPTIVE).save(
        tmp_path / "p.png")
    im = read_image(tmp_path, {"path": "p.png"})
    assert im.mode == "RGB" and pixels(im)[1][1] == [90, 90, 90]


def test_rgb_tiff_and_jpeg(tmp_path):
    tile = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(4, 3, 3) * 7
    Image.fromarray(tile).save(tmp_path / "t.tif", format="TIFF")
    im = read_image(tmp_path, {"path": "t.tif"})
    assert im.mode == "RGB" and np.array_equal(np.asarray(im), tile)
    Image.fromarray(np.full((16, 16, 3), 128, np.uint8)).save(tmp_path / "j.jpg", quality=95)
    im = read_image(tmp_path, {"path": "j.jpg"})
    assert im.mode == "RGB" and np.abs(np.asarray(im).astype(int) - 128).max() <= 1


def test_hdf5_row_locator_reads_one_row_and_keeps_the_file_open(tmp_path):
    data = np.arange(5 * 4 * 4 * 3, dtype=np.uint8).reshape(5, 4, 4, 3)
    (tmp_path / "sub").mkdir()
    with h5py.File(tmp_path / "sub" / "split_x.h5", "w") as f:
        f.create_dataset("x", data=data)
    images._h5_files.clear()
    im = read_image(tmp_path, {"path": "sub/split_x.h5#3"})
    assert im.mode == "RGB" and np.array_equal(np.asarray(im), data[3])
    assert np.array_equal(np.asarray(read_image(tmp_path, {"path": "sub/split_x.h5#0"})), data[0])
    assert list(images._h5_files) == [str(tmp_path / "sub" / "split_x.h5")]  # one handle, reused
    with pytest.raises(ValueError, match="row 5 out of range"):
        read_image(tmp_path, {"path": "sub/split_x.h5#5"})
    images._h5_files.clear()


def test_npz_key_locator(tmp_path):
    slo = np.arange(12, dtype=np.uint8).reshape(3, 4)
    np.savez(tmp_path / "data_00001.npz", slo_fundus=slo, oct_bscans=np.zeros((2, 3, 4), np.uint8))
    im = read_image(tmp_path, {"path": "data_00001.npz#slo_fundus"})
    assert im.mode == "L" and np.array_equal(np.asarray(im), slo)
    with pytest.raises(ValueError, match="no array 'slo'"):
        read_image(tmp_path, {"path": "data_00001.npz#slo"})


def test_crop_columns_remove_edges(tmp_path):
    arr = np.arange(6 * 5, dtype=np.uint8).reshape(6, 5)
    Image.fromarray(arr).save(tmp_path / "c.png")
    im = read_image(tmp_path, {"path": "c.png", "crop_bottom": 2, "crop_left": 1, "crop_top": float("nan")})
    assert np.array_equal(np.asarray(im), arr[:4, 1:])
    with pytest.raises(ValueError, match="leaves nothing"):
        read_image(tmp_path, {"path": "c.png", "crop_bottom": 6})


def test_default_reader_delegates_to_read_image(tmp_path):
    # 16 x 32 px: the smallest image the extraction reads (data.images.MIN_IMAGE_SIDE)
    write_dicom(tmp_path / "d.dcm", np.tile(np.array([[0, 400]], dtype=np.uint16), (16, 16)), "MONOCHROME1")
    assert pixels(default_reader(tmp_path, {"path": "d.dcm"})) == [[255, 0] * 16] * 16


def test_read_mask_binarises_red_lesions(tmp_path):
    rgb = np.zeros((3, 4, 3), np.uint8)
    rgb[1, 2, 0] = 255
    Image.fromarray(rgb).save(tmp_path / "IDRiD_01_MA.tif", format="TIFF")
    mask = read_mask(tmp_path / "IDRiD_01_MA.tif")
    assert mask.dtype == bool and mask.sum() == 1 and mask[1, 2]


def test_dispatch_is_by_content(tmp_path):
    write_dicom(tmp_path / "IM0001", np.array([[0, 400]], dtype=np.uint16))  # DICOM without a suffix
    assert pixels(read_image(tmp_path, {"path": "IM0001"})) == [[0, 255]]
    Image.fromarray(np.array([[9, 8]], dtype=np.uint8)).save(tmp_path / "misnamed.dcm", format="PNG")
    assert pixels(read_image(tmp_path, {"path": "misnamed.dcm"})) == [[9, 8]]


def test_bare_dicom_data_set_without_preamble(tmp_path):
    import pydicom

    write_dicom(tmp_path / "a.dcm", np.array([[0, 400]], dtype=np.uint16), "MONOCHROME1")
    ds = pydicom.dcmread(tmp_path / "a.dcm")
    ds.preamble = None
    del ds.file_meta
    ds.save_as(tmp_path / "bare.dcm", implicit_vr=True, little_endian=True, enforce_file_format=False)
    assert (tmp_path / "bare.dcm").read_bytes()[128:132] != b"DICM"
    assert pixels(read_image(tmp_path, {"path": "bare.dcm"})) == [[255, 0]]


def test_jpeg2000_compressed_dicom(tmp_path):
    raw = np.array([[0, 100], [200, 400]], dtype=np.uint16)
    write_dicom(tmp_path / "j2k.dcm", raw, "MONOCHROME1", jpeg2000=True)
    assert pixels(read_image(tmp_path, {"path": "j2k.dcm"})) == [[255, 191], [127, 0]]


def test_bad_locators_are_invalid_settings_naming_the_file(tmp_path):
    from robustbench_fm.core.errors import InvalidSetting

    np.savez(tmp_path / "a.npz", slo_fundus=np.zeros((3, 4), np.uint8))
    with pytest.raises(InvalidSetting) as err:
        read_image(tmp_path, {"path": "a.npz#slo"})
    assert isinstance(err.value, ValueError)
    assert str(err.value) == f"{tmp_path / 'a.npz'}: no array 'slo' (has slo_fundus); fix the '#<key>' of the path"
