"""PathoROB adapters on the real metadata CSVs with synthetic tiles in the HF parquet layout:
exact RI / APD row sets (conventions E), locators that read back the right tile, clear errors,
and the PCaBiop-ISUP pair design."""
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from pathorob_roots import METADATA, grey_of

from robustbench_fm import data
from robustbench_fm.data import manifest as mf
from robustbench_fm.data.cards import CONFIG_DIR, check, load_card
from robustbench_fm.data.pathorob import (
    isup_pair_occurrences,
    median_of_pair_medians,
    read_parquet_image,
)
from robustbench_fm.methods.croma import shortcut
from robustbench_fm.methods.croma import shortcut_metrics as sm


def build(name, root, **options):
    return data.build_manifest(name, root, verify_images=False, **options)


def test_camelyon_ri_and_apd_rows(pathorob_roots):
    ri = build("pathorob_camelyon", pathorob_roots["camelyon"])
    assert len(ri) == 20400 and ri["slide_id"].nunique() == 68
    assert ri.groupby(["site", "bio_label"]).size().to_dict() == {
        (c, b): 5100 for c in ("RUMC", "UMCU") for b in ("normal", "tumor")}
    assert ri["sample_id"].iloc[0] == "test_035-34317" and ri["patient_id"].equals(ri["slide_id"])
    apd = build("pathorob_camelyon", pathorob_roots["camelyon"], view="apd")
    assert len(apd) == 22402
    assert apd["site"].value_counts()[["CWZ", "RST", "LPON"]].sum() == 2002


def test_tcga4x4_rows_and_case_ids(pathorob_roots):
    ri = build("pathorob_tcga4x4", pathorob_roots["tcga"])
    assert len(ri) == 5760 and ri["site"].nunique() == 4 and ri["slide_id"].nunique() == 192
    assert set(ri.groupby(["site", "bio_label"]).size()) == {360}
    assert (ri["patient_id"] == ri["slide_id"].str[:12]).all()
    assert len(build("pathorob_tcga4x4", pathorob_roots["tcga"], view="apd")) == 8160


def test_tolkach_ri_is_the_reduced_set_and_apd_the_full_file(pathorob_roots):
    ri = build("pathorob_tolkach", pathorob_roots["tolkach_esca"])
    assert len(ri) == 9000 and ri["slide_id"].nunique() == 43 and ri["site"].nunique() == 3
    assert set(ri.groupby(["site", "bio_label"]).size()) == {500}
    apd = build("pathorob_tolkach", pathorob_roots["tolkach_esca"], view="apd")
    assert len(apd) == 16300
    assert apd["site"].value_counts()[["VALSET1_UKK", "VALSET3_TCGA"]].tolist() == [3000, 2500]


def test_tcga2x2_one_row_per_occurrence(pathorob_roots):
    # build_manifest validates sample_id alone; the paired key is (sample_id, subset)
    m = mf.validate(data.get("pathorob_tcga2x2").build(pathorob_roots["tcga"]), unique=("sample_id", "subset"))
    assert len(m) == 36 and m["subset"].nunique() == 3
    assert m["sample_id"].duplicated().sum() == 6  # Asterand breast (q0, q1), Roswell Park colon (q0, q2)
    assert not m.duplicated(["sample_id", "subset"]).any()
    with pytest.raises(ValueError, match="no APD view"):
        build("pathorob_tcga2x2", pathorob_roots["tcga"], view="apd")


def test_locators_read_back_the_metadata_tile(pathorob_roots):
    root = pathorob_roots["camelyon"]
    meta = pd.read_csv(METADATA / "camelyon.csv", dtype=str)
    m = build("pathorob_camelyon", root, view="apd")
    for i in (0, 4095, 4096, 17000, 22401):
        im = read_parquet_image(root, m.iloc[i].to_dict())
        assert im.size == (4, 4)
        assert int(np.asarray(im)[0, 0]) == grey_of(i)
        assert m.at[i, "sample_id"] == f"{meta.at[i, 'slide_id']}-{meta.at[i, 'patch_id']}"


def test_missing_tiles_and_metadata_fail_in_one_line(pathorob_roots, tmp_path):
    with pytest.raises(FileNotFoundError, match="camelyon.csv: metadata file missing"):
        build("pathorob_camelyon", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no \*\.parquet files"):
        build("pathorob_camelyon", tmp_path, metadata_dir=pathorob_roots["camelyon"] / "metadata")
    root = pathorob_roots["tcga"]
    (tmp_path / "tcga_4x4.csv").write_text("subset,slide_id,patch_id,biological_class,medical_center\n"
                                           "ID,TCGA-XX,0_0_1,Colon_adenocarcinoma,Asterand\n")
    with pytest.raises(FileNotFoundError, match="1 of 1 rows .* first 'TCGA-XX-0_0_1'"):
        build("pathorob_tcga4x4", root, metadata_dir=tmp_path)
    with pytest.raises(ValueError, match="view='x' unknown"):
        build("pathorob_tcga4x4", root, view="x")


def test_adapters_are_registered_with_their_card():
    for name in ("pathorob_camelyon", "pathorob_tcga4x4", "pathorob_tcga2x2", "pathorob_tolkach"):
        adapter = data.get(name)
        assert adapter.access and adapter.licence and "2507.17845" in adapter.citation


def test_isup_pairs_and_median_of_pair_medians():
    grades = np.repeat(np.arange(6), 4)
    slides = pd.DataFrame({"sample_id": [f"s{i}" for i in range(24)], "bio_label": grades.astype(str),
                           "site": np.tile(["KI", "RUMC"], 12)})
    occ = isup_pair_occurrences(slides)
    assert occ["subset"].nunique() == 15 and len(occ) == 15 * 8
    assert not occ.duplicated(["sample_id", "subset"]).any()
    assert (occ.groupby("subset")["site"].nunique() == 2).all()
    # per-occurrence value = grade a + grade b of its pair + 0.1 * occurrence rank inside the pair
    a_b = occ["subset"].str.split("_vs_", expand=True).astype(int)
    occ["croma"] = a_b[0] + a_b[1] + 0.1 * occ.groupby("subset").cumcount()
    headline, per_pair = median_of_pair_medians(occ)
    assert per_pair["0_vs_1"] == pytest.approx(1.35) and len(per_pair) == 15
    sums = sorted(a + b for a in range(6) for b in range(a + 1, 6))
    assert headline == pytest.approx(sums[7] + 0.35)  # median of the 15 pair sums (5) + 0.35
    with pytest.raises(ValueError, match="exactly 2 centres"):
        isup_pair_occurrences(slides.assign(site=np.arange(24) % 3))


@pytest.mark.parametrize("name,key", [("pathorob_camelyon", "camelyon"), ("pathorob_tcga4x4", "tcga"),
                                      ("pathorob_tcga2x2", "tcga"), ("pathorob_tolkach", "tolkach_esca")])
def test_dataset_config_cards_match_the_adapters_and_manifests(name, key, pathorob_roots):
    cfg = OmegaConf.load(CONFIG_DIR / "dataset" / f"{name}.yaml")
    assert cfg.name == name and OmegaConf.to_container(cfg)["root"] == f"${{paths.data_dir}}/pathorob/{key}"
    adapter, card = data.get(name), load_card(name)
    assert (card["access"], card["licence"], card["citation"]) == (adapter.access, adapter.licence, adapter.citation)
    if name != "pathorob_tcga2x2":  # its real tcga_2x2.csv is not available here
        assert check(build(name, pathorob_roots[key], **cfg.options), card, name) == []


@pytest.mark.parametrize("name,key,benchmark,slides", [("pathorob_camelyon", "camelyon", "camelyon", 17),
                                                       ("pathorob_tcga4x4", "tcga", "tcga", 12),
                                                       ("pathorob_tolkach", "tolkach_esca", "tolkach_esca", 9)])
def test_apd_views_are_slide_contiguous_cells_of_the_shortcut_protocol(name, key, benchmark, slides, pathorob_roots):
    """Conventions B: every (centre, class) cell of the real metadata is a run of whole slides of
    300 / 30 / 100 rows, 17 / 12 / 9 slides per cell."""
    m = build(name, pathorob_roots[key], view="apd")
    bm = sm.benchmark(benchmark)
    cells = shortcut._cells(m, bm, "bio_label", "site", "slide_id", bm.rows_per_slide)
    assert {len(cell) for row in cells for cell in row} == {slides}
    assert m["site"].isin(bm.centres + bm.ood_centres).all()


def test_bad_input_is_a_user_error_naming_the_file_and_a_plain_bug_is_not(pathorob_roots, tmp_path):
    """The CLI prints a UserError as one line (exit 2) and anything else as a bug: a missing
    metadata file, an unknown view and a bad locator are the user's; a per-sample table the
    method built without its column is an internal invariant, left a plain ValueError."""
    from robustbench_fm.core.errors import InvalidSetting, UserError
    from robustbench_fm.data.files import DatasetError, DatasetFileMissing
    from robustbench_fm.data.pathorob import parse_locator

    with pytest.raises(DatasetFileMissing) as err:
        build("pathorob_camelyon", tmp_path, metadata_dir=tmp_path)
    assert isinstance(err.value, (UserError, FileNotFoundError))
    assert str(err.value).startswith(f"{tmp_path / 'camelyon.csv'}: metadata file missing")
    assert "metadata_dir" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DatasetError) as err:
        build("pathorob_tcga4x4", pathorob_roots["tcga"], view="x")
    assert isinstance(err.value, ValueError) and "option view='x' unknown; use 'ri'" in str(err.value)
    with pytest.raises(InvalidSetting, match=r"'tiles\.parquet' is not a parquet locator; expected "
                                             r"'<file>\.parquet#<row index>'"):
        parse_locator("tiles.parquet")
    with pytest.raises(ValueError, match="per-sample table has no column 'croma'") as err:
        median_of_pair_medians(pd.DataFrame({"subset": ["a"]}))
    assert not isinstance(err.value, UserError)
