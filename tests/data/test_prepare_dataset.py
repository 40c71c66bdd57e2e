"""scripts/prepare_dataset.py: resized PNG copies + a manifest relative to OUT; resumable."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from feature_fixtures import write_jpeg_films
from fixtures_derm import write_ddi
from fixtures_natural import write_fgvc
from fixtures_pathology import pcam_patch, write_pcam
from PIL import Image

from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.data import manifest as mf
from robustbench_fm.data.images import read_image

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_dataset.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("prepare_dataset", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare_dataset"] = module  # so that worker processes can unpickle its functions
    spec.loader.exec_module(module)
    yield module
    del sys.modules["prepare_dataset"]


def stamps(out):
    return {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in sorted(out.rglob("*")) if p.is_file()}


def test_copies_are_resized_cropped_and_the_manifest_points_at_them(script, tmp_path):
    src, out = write_fgvc(tmp_path / "src"), tmp_path / "out"
    target, written = script.prepare("fgvc_aircraft", src, out, size=16, progress=False)
    assert written == 7 and target == out / "manifest.csv"
    m = mf.read(target)
    assert len(m) == 7 and "crop_bottom" not in m.columns and m["path"].iloc[0] == "images/fgvc_0034309.png"
    assert m.set_index("sample_id").loc["fgvc_0041135", "bio_label"] == "F-16A/B"
    im = read_image(out, m.iloc[0].to_dict())
    assert im.size == (16, 16) and im.mode == "RGB"
    assert np.abs(np.asarray(im).astype(int) - 40).max() <= 3  # banner cropped before the resize


def test_second_run_rewrites_nothing_and_a_deleted_file_is_redone(script, tmp_path):
    src, out = write_fgvc(tmp_path / "src"), tmp_path / "out"
    script.prepare("fgvc_aircraft", src, out, size=16, progress=False)
    before = stamps(out)
    assert len(before) == 9  # 7 images, manifest.csv, prepare.json
    _, written = script.prepare("fgvc_aircraft", src, out, size=16, progress=False)
    assert written == 0 and stamps(out) == before
    (out / "images" / "fgvc_0041135.png").unlink()
    _, written = script.prepare("fgvc_aircraft", src, out, size=16, progress=False)
    assert written == 1 and set(stamps(out)) == set(before)
    with pytest.raises(SystemExit, match="holds dataset 'fgvc_aircraft' at size 16"):
        script.prepare("fgvc_aircraft", src, out, size=224, progress=False)


def test_cli_hdf5_rows_at_native_size_are_exact(script, tmp_path, capsys):
    src, out = write_pcam(tmp_path / "src"), tmp_path / "out"
    assert script.main(["pcam", str(src), str(out), "--size", "96", "--no-verify", "--option", "splits=[valid]"]) == 0
    assert "pcam: 3 images written at 96px" in capsys.readouterr().out
    m = mf.read(out / "manifest.csv", findings=["tumour"])
    assert m["path"].tolist() == ["images/valid_000000.png", "images/valid_000001.png", "images/valid_000002.png"]
    assert m["tumour"].tolist() == [0.0, 1.0, 1.0]
    assert np.array_equal(np.asarray(Image.open(out / m["path"].iloc[1])), pcam_patch("valid", 1))


def test_size_512_with_two_workers_matches_one(script, tmp_path):
    src = write_ddi(tmp_path / "src")
    _, written = script.prepare("ddi", src, tmp_path / "one", size=512, progress=False)
    _, written2 = script.prepare("ddi", src, tmp_path / "two", size=512, progress=False, workers=2)
    assert written == written2 == 4 and Image.open(tmp_path / "two" / "images" / "ddi_1.png").size == (512, 512)
    for name in ("ddi_1", "ddi_4"):
        one, two = (np.asarray(Image.open(tmp_path / d / "images" / f"{name}.png")) for d in ("one", "two"))
        assert np.array_equal(one, two)


def test_stored_names_are_safe_relative_paths(script):
    assert script.stored_name("NCT-CRC-HE-100K/ADI-AAAF") == "images/NCT-CRC-HE-100K/ADI-AAAF.png"
    assert script.stored_name("../a b:c") == "images/a_b_c.png"


def _jpeg_films(root, n: int = 2) -> Path:
    """Grey 1,024 px JPEG films and a CSV manifest (dataset ``csv``): at 224 px the scaled path decodes at 1/2."""
    paths = write_jpeg_films(root, n, seed=1)
    (root / "films.csv").write_text("path\n" + "".join(f"{p}\n" for p in paths))
    return root / "films.csv"


@pytest.mark.parametrize("decode", ["scaled", "exact"])
def test_copies_hold_the_prepared_stores_pixels_for_each_decode_mode(script, tmp_path, decode):
    """--decode: the copies are the experiments' prepared store's pixels for the same mode; exact
    ones are the full-size decode resized (the copies of earlier releases), scaled ones the 1/2
    decode resized, and the two differ."""
    from robustbench_fm.data import build_manifest
    from robustbench_fm.data.images import need_of
    from robustbench_fm.data.prepared import prepare as store_prepare
    from robustbench_fm.data.prepared import prepare_image

    csv = _jpeg_films(tmp_path / "src")
    out = tmp_path / "out"
    assert script.main(["csv", str(csv.parent), str(out), "--size", "224", "--option", f"manifest={csv}",
                        "--decode", decode]) == 0
    copies = mf.read(out / "manifest.csv")
    source = build_manifest("csv", csv.parent, verify_images=False, manifest=csv)
    store = store_prepare(source, csv.parent, tmp_path / "store", 224, progress=False, decode=decode)
    need = need_of("squash", 224) if decode == "scaled" else None
    for row, stored, src in zip(copies.to_dict("records"), store.manifest.to_dict("records"),
                                source.to_dict("records")):
        got = np.asarray(read_image(out, row))
        assert got.shape == (224, 224)
        assert np.array_equal(got, np.asarray(read_image(store.root, stored)))
        assert np.array_equal(got, np.asarray(prepare_image(read_image(csv.parent, src, need), 224)))
        other = prepare_image(read_image(csv.parent, src, None if need else need_of("squash", 224)), 224)
        assert not np.array_equal(got, np.asarray(other))
    assert read_image(csv.parent, source.iloc[0].to_dict(), need_of("squash", 224)).size == (512, 512)
    record = json.loads((out / "prepare.json").read_text())
    assert record.get("decode") == ("scaled" if decode == "scaled" else None)


def test_a_second_run_with_another_decode_mode_stops(script, tmp_path):
    src, out = write_fgvc(tmp_path / "src"), tmp_path / "out"
    script.prepare("fgvc_aircraft", src, out, size=16, progress=False, decode="exact")
    # an OUT written before --decode existed has no decode field: it is an exact OUT
    assert "decode" not in json.loads((out / "prepare.json").read_text())
    with pytest.raises(SystemExit, match=r"\(decode exact\); choose another OUT .* \(decode scaled\)"):
        script.prepare("fgvc_aircraft", src, out, size=16, progress=False)
    with pytest.raises(InvalidSetting, match="^--decode='fast': use scaled"):
        script.prepare("fgvc_aircraft", src, tmp_path / "o2", size=16, progress=False, decode="fast")
