"""``stage=confounders`` on the command line with ``dataset=csv`` (issue 55 item 4): a user's CSV with their
own columns (a site whose images are brighter, a scanner that changes nothing, an age) beside the finding;
the scan reads every column the manifest carries, and report.md / report.html show what each encoder's
neighbourhoods follow."""
import cli_process
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from robustbench_fm.data.synthetic import generate_planted

pytestmark = pytest.mark.slow  # a command-line job (~30 s on 2 shared cores)

N = 60


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    planted = generate_planted(root / "planted", n=N, size=64, seed=0)
    labels = pd.read_csv(planted / "labels.csv")
    rng = np.random.default_rng(0)
    patient = np.arange(N) // 2
    site = rng.integers(0, 2, N // 2)[patient]  # a patient is imaged at one site
    for name, s in zip(labels["image"], site):  # site "east" brightens its images: an acquisition shift
        if s:
            path = planted / "images" / name
            pixels = np.asarray(Image.open(path), dtype=np.int16)
            Image.fromarray(np.clip(pixels + 50, 0, 255).astype(np.uint8)).save(path)
    pd.DataFrame({"path": [f"planted/images/{f}" for f in labels["image"]], "marker": labels["marker"],
                  "patient_id": [f"p{v:02d}" for v in patient], "site": np.array(["west", "east"])[site],
                  "scanner": rng.choice(["GE", "Philips"], N), "age": rng.uniform(30, 80, N).round(1)}
                 ).to_csv(root / "labels.csv", index=False)
    out = root / "run"
    proc = cli_process.run(["-m", "robustbench_fm", f"paths.root={root}", "dataset=csv",
                            f"dataset.manifest={root / 'labels.csv'}", "encoders=[planted_blur,planted_sharp]",
                            "stage=confounders", "stage.params.n_boot=200", f"hydra.run.dir={out}"],
                           cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, pd.read_parquet(out / "summary.parquet")


def test_the_scan_reads_the_users_columns_and_the_finding(run):
    out, summary = run
    # sample_id, path, patient_id: ids; acq_group: the csv adapter's one value 'all'
    assert set(summary["column"]) == {"marker", "site", "scanner", "age"} and summary["reason"].eq("").all()
    rows = summary.set_index(["encoder", "column"])
    assert rows.loc[("planted_blur", "marker"), "kind"] == "finding" and rows.loc[("planted_blur", "site"), "kind"] \
        == "metadata"
    assert rows.loc[("planted_blur", "age"), "binning"].startswith("5 quantile bins of ")
    blur_site, blur_marker = rows.loc[("planted_blur", "site")], rows.loc[("planted_blur", "marker")]
    assert blur_site["score_ci_low"] > blur_marker["score_ci_high"]  # blind to the marker, not to the site
    sharp_marker, sharp_scanner = rows.loc[("planted_sharp", "marker")], rows.loc[("planted_sharp", "scanner")]
    assert sharp_marker["score_ci_low"] > sharp_scanner["score_ci_high"]
    assert rows.loc[("planted_blur", "scanner"), "score_ci_low"] < 0 < rows.loc[("planted_blur", "scanner"),
                                                                                "score_ci_high"]
    for column in ("marker", "site", "scanner", "age"):  # results per column, with the per-item table
        items = pd.read_parquet(out / "results" / "planted_blur" / "csv" / "confounders" / column
                                / "per_sample.parquet")
        assert len(items) == N and items["cluster"].nunique() == N // 2


def test_the_report_says_what_each_encoders_neighbourhoods_follow(run):
    out, summary = run
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    site = summary[(summary["encoder"] == "planted_blur") & (summary["column"] == "site")].iloc[0]
    shown = f"`site` ({site['score']:.2f} [{site['score_ci_low']:.2f}, {site['score_ci_high']:.2f}])"
    assert "## What the neighbourhoods follow" in md
    assert f"planted_blur: its neighbourhoods follow {shown} more than" in md
    assert "<h2>What the neighbourhoods follow</h2>" in page and "| column | kind | values | chance |" in md


def test_a_csv_of_metadata_alone_is_scanned_without_a_finding(tmp_path):
    """Issue 55 item 4: a manifest with no 0/1 column (the user's site and scanner only) is scanned, where a
    stage that scores findings refuses it in one line."""
    planted = generate_planted(tmp_path / "planted", n=40, size=64, seed=1)
    labels = pd.read_csv(planted / "labels.csv")
    rng = np.random.default_rng(1)
    pd.DataFrame({"path": [f"planted/images/{f}" for f in labels["image"]],
                  "patient_id": [f"p{v:02d}" for v in np.arange(40) // 2],
                  "site": rng.choice(["west", "east"], 40), "scanner": rng.choice(["GE", "Philips", "Siemens"], 40)}
                 ).to_csv(tmp_path / "meta.csv", index=False)
    common = ["-m", "robustbench_fm", f"paths.root={tmp_path}", "dataset=csv",
              f"dataset.manifest={tmp_path / 'meta.csv'}", "encoders=[planted_blur]"]
    out = tmp_path / "run"
    proc = cli_process.run([*common, "stage=confounders", "stage.params.n_boot=100", f"hydra.run.dir={out}"],
                           cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = pd.read_parquet(out / "summary.parquet")
    assert set(summary["column"]) == {"site", "scanner"} and set(summary["kind"]) == {"metadata"}
    assert summary["reason"].eq("").all() and summary["score_ci_low"].notna().all()
    refused = cli_process.run([*common, "stage=candor", f"hydra.run.dir={tmp_path / 'candor'}"], cwd=tmp_path,
                              timeout=600)
    assert refused.returncode == 2 and "meta.csv" in refused.stderr
