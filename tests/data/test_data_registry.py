"""robustbench_fm.data.registry.build_manifest: the one-line user errors every adapter gets from it
(a root that is not there, an option the adapter does not take, images missing under the root)."""
import pytest
from fixtures_pathology import write_nct_crc

from robustbench_fm.core.errors import UserError
from robustbench_fm.data import build_manifest
from robustbench_fm.data.files import DatasetFileMissing, UnknownOption


def test_an_option_the_adapter_does_not_take_names_it_and_the_ones_it_takes(tmp_path):
    write_nct_crc(tmp_path)
    with pytest.raises(UnknownOption) as err:
        build_manifest("nct_crc", tmp_path, subset=["CRC-VAL-HE-7K"])  # the option is `subsets`
    assert isinstance(err.value, (UserError, TypeError))
    assert str(err.value) == ("dataset 'nct_crc': no option dataset.options.subset; did you mean "
                              "dataset.options.subsets? it takes subsets; "
                              "remove it or fix its name")
    assert len(build_manifest("nct_crc", tmp_path, subsets=["CRC-VAL-HE-7K"])) == 5  # the right name still works


def test_a_missing_root_and_missing_images_name_the_folder_and_the_setting(tmp_path):
    with pytest.raises(DatasetFileMissing) as err:
        build_manifest("nct_crc", tmp_path / "nowhere")
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value) == (f"dataset 'nct_crc': root '{tmp_path / 'nowhere'}' does not exist; "
                              "set dataset.root to the folder holding the dataset")
    (tmp_path / "labels.csv").write_text("path,marker\na.png,1\nb.png,0\n")
    (tmp_path / "b.png").write_bytes(b"")  # present: the check is for files, not their contents
    with pytest.raises(DatasetFileMissing) as err:
        build_manifest("csv", tmp_path, manifest=tmp_path / "labels.csv", finding_columns=["marker"])
    # issue 41 item 11: the command line's form, and what the run then does at that image
    assert str(err.value) == (f"dataset 'csv': 1 of 2 images missing under '{tmp_path}', first 'a.png' (row 0); "
                              "fix dataset.root, or set dataset.verify_images=false (Python: verify_images=False) to "
                              "run without them: the run then stops at the first missing image unless "
                              "extract.on_bad_image=skip, which leaves them out and lists them in skipped.csv")


def test_a_path_naming_a_folder_is_not_reported_as_missing(tmp_path):
    """Issue 41 item 10: a row whose path is a folder was "missing"."""
    from robustbench_fm.data.files import DatasetError

    (tmp_path / "sub").mkdir()
    (tmp_path / "b.png").write_bytes(b"")
    (tmp_path / "labels.csv").write_text("path,marker\nb.png,1\nsub,0\n")
    with pytest.raises(DatasetError) as err:
        build_manifest("csv", tmp_path, manifest=tmp_path / "labels.csv", finding_columns=["marker"])
    assert not isinstance(err.value, FileNotFoundError)
    assert str(err.value) == (f"dataset 'csv': 1 of 2 paths are folders, not image files, first 'sub' (row 1); "
                              f"name each image file under '{tmp_path}'")
