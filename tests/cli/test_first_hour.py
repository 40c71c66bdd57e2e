"""A newcomer's first hour (issue 16): what a user who installed with the README's plain
``pip install -e .``, mistyped a setting or pointed the tool at an unusual folder sees. Every bad
input gets one line on stderr starting ``error:`` (exit code 2) naming the setting and a fix that
works; nothing is read or written before that."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import cli_process
import pytest

from robustbench_fm import encoders as enc
from robustbench_fm.encoders.loaders.extras import INSTALL, MissingExtraError

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, timeout=300, **kwargs):
    return cli_process.run(["-m", "robustbench_fm", *args], cwd=ROOT, timeout=timeout, **kwargs)


def one_error_line(proc) -> str:
    """The run failed with exit code 2 and exactly one stderr line, an ``error:`` line."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------ item 3: the doctor

@pytest.fixture
def no_xrv(monkeypatch):
    """torchxrayvision not importable, as after the README's ``pip install -e .`` (no dev extra)."""
    monkeypatch.setitem(sys.modules, "torchxrayvision", None)


def test_doctor_runs_without_torchxrayvision_and_says_how_to_install_it(no_xrv):
    from robustbench_fm.cli.doctor import report

    text = report(["densenet121_xrv", "planted_sharp"])
    lines = text.splitlines()
    assert lines[0].split() == ["encoder", "offline", "packages", "weights", "access"]
    assert lines[1].startswith("densenet121_xrv  no       missing torchxrayvision  "
                               "unknown: torchxrayvision not installed")
    assert lines[2].split()[:3] == ["planted_sharp", "yes", "ok"]
    assert len({ln.index(" ok ") if " ok " in ln else ln.index(" missing ") for ln in lines[1:3]}) == 1  # aligned
    assert lines[3] == ("1 of 2 encoders can run offline now; pass encoder.weights=PATH for the others")
    assert lines[4:] == ["missing packages, one install line each:",
                         "  pip install 'robustbench_fm[xrv]'  # torchxrayvision (for densenet121_xrv)"]


def test_loading_the_xrv_entry_without_torchxrayvision_names_the_extra(no_xrv):
    with pytest.raises(MissingExtraError) as err:
        enc.load("densenet121_xrv", device="cpu")
    assert str(err.value) == ("encoder 'densenet121_xrv' needs the optional package(s) torchxrayvision "
                              "(extra 'xrv': pip install 'robustbench_fm[xrv]')")


def test_every_missing_package_gets_one_install_line_from_the_extras(monkeypatch):
    """With nothing importable, every package of every entry is listed under an install line
    naming that entry, and every robustbench_fm extra a line names exists in pyproject.toml."""
    from robustbench_fm.cli import doctor
    from robustbench_fm.encoders.loaders.extras import CORE_INSTALL

    monkeypatch.setattr(doctor, "_module_found", lambda name: False)
    text = doctor.report()
    install = text.split("missing packages, one install line each:\n", 1)[1].splitlines()
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    covered: dict[str, set[str]] = {}
    for line in install:
        command, comment = (part.strip() for part in line.split("  # ", 1))
        assert command in set(INSTALL.values()) | {CORE_INSTALL}, line
        assert set(re.findall(r"robustbench_fm\[(\w+)\]", command)) <= extras, line
        packages, encoders = re.fullmatch(r"(.+) \(for (.+)\)", comment).groups()
        for name in encoders.split(", "):
            covered.setdefault(name, set()).update(packages.split(", "))
    for name in enc.names():
        spec = enc.get(name)
        want = set(spec.requires) | ({doctor._LIBRARY_MODULES[spec.library]} - {None})
        assert want <= covered.get(name, set()), name
    assert set(covered) == {n for n in enc.names() if enc.get(n).library != "synthetic"}
    assert "  pip install 'robustbench_fm[xrv]'" in text and "git+https://github.com/Mahmoodlab/CONCH" in text


@pytest.mark.parametrize("name, message", [
    ("nosuch", "error: doctor: unknown encoder 'nosuch'; run 'python -m robustbench_fm list encoders'"),
    ("planted_sharpp", "error: doctor: unknown encoder 'planted_sharpp'; did you mean planted_sharp, planted_blur?"),
])
def test_doctor_with_an_unknown_name_prints_one_line(name, message):
    proc = cli("doctor", "planted_blur", name)
    assert one_error_line(proc) == message
    assert proc.stdout == ""


# ------------------------------------------------------------------ item 5: experiment=from_features

@pytest.fixture
def own_features(tmp_path):
    """60 embeddings that separate 'marker' and their manifest, without an acq_group column."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(60)]
    marker = (np.arange(60) % 2).astype(float)
    emb = rng.normal(size=(60, 8)).astype(np.float32)
    emb[:, 0] += 3 * marker
    pq.write_table(pa.table({"sample_id": ids, "embedding": [e.tolist() for e in emb]}), tmp_path / "feats.parquet")
    pd.DataFrame({"sample_id": ids, "patient_id": [f"p{i}" for i in range(60)], "site": "a",
                  "marker": marker}).to_csv(tmp_path / "manifest.csv", index=False)
    return tmp_path / "feats.parquet", tmp_path / "manifest.csv"


def test_from_features_names_each_missing_setting_instead_of_running_the_demo(own_features, tmp_path):
    feats, manifest = own_features
    out = f"paths.output_root={tmp_path / 'out'}"
    assert one_error_line(cli(out, "experiment=from_features")) == (
        "error: features_file is not set: experiment=from_features needs the parquet of your features (columns "
        "sample_id, embedding) or a feature-cache folder: add features_file=/path/to/features.parquet")
    assert one_error_line(cli(out, "experiment=from_features", f"features_file={feats}")) == (
        "error: manifest_file is not set: experiment=from_features needs the manifest of those samples (CSV or "
        "parquet: sample_id, the finding columns, acq_group, patient_id): add manifest_file=/path/to/manifest.csv")
    assert one_error_line(cli(out, "experiment=from_features", f"features_file={feats}",
                              f"manifest_file={manifest}")) == (
        "error: stage.findings is not set: experiment=from_features needs the manifest's 0/1 finding columns to "
        f"score: add stage.findings=[marker] (the non-canonical columns of {manifest}: marker)")
    assert not (tmp_path / "out" / "demo_data").exists() and not (tmp_path / "out" / "cache").exists()
    assert not list((tmp_path / "out").rglob("summary.parquet"))  # the demo did not run


def test_a_missing_group_column_names_the_stage_parameter_override(own_features):
    import pandas as pd

    import robustbench_fm

    feats, manifest = own_features
    with pytest.raises(ValueError) as err:
        robustbench_fm.evaluate("candor", str(feats), pd.read_csv(manifest), finding="marker", n_boot=0)
    assert str(err.value) == (
        "candor: the manifest has no column 'acq_group' (group_col); add it, or name one of its columns with "
        "stage.params.group_col=<column> (group_col= in Python; columns: sample_id, patient_id, site, marker)")
    with pytest.raises(ValueError, match=r"no column 'tumour' \(finding\); add it, or name one of its columns "
                                         r"with stage.findings=\[<column>\]"):
        robustbench_fm.evaluate("candor", str(feats), pd.read_csv(manifest), finding="tumour", group_col="site")


@pytest.mark.slow
def test_the_suggested_from_features_overrides_run(own_features, tmp_path):
    """The overrides the errors suggest, with the user's values, make a run that scores."""
    import pandas as pd

    feats, manifest = own_features
    args = [f"paths.output_root={tmp_path / 'out'}", "experiment=from_features", f"features_file={feats}",
            f"manifest_file={manifest}", "stage.params.n_boot=10"]
    findings = re.search(r"add (stage\.findings=\[\w+\])", one_error_line(cli(*args))).group(1)
    group = re.search(r"with (stage\.params\.group_col=)<column>", one_error_line(cli(*args, findings))).group(1)
    proc = cli(*args, findings, group + "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = pd.read_parquet(next((tmp_path / "out" / "runs").glob("*/*/summary.parquet")))
    assert summary["acq_group"].tolist() == ["a", "__pooled__"] and summary["n_queries"].tolist() == [30, 30]
    assert summary["encoder"].unique().tolist() == ["feats"] and summary["d"].iloc[0] < 0.2


# ------------------------------------------------------------------ item 6: read-only cache and output folder

def test_a_complete_cache_entry_is_read_from_a_read_only_cache(tmp_path, monkeypatch):
    """No lock file, no bookkeeping write: the second extraction only reads."""
    import numpy as np
    import readonly_fs
    from feature_fixtures import tiny_encoder, write_images

    from robustbench_fm.features import extract

    manifest = write_images(tmp_path / "images", n=20)
    encoder = tiny_encoder()
    first = extract(encoder, manifest, tmp_path / "images", tmp_path / "cache", shard_size=8, progress=False)
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "cache").rglob("*"))
    readonly_fs.install(tmp_path / "cache", monkeypatch.setattr)
    with pytest.raises(OSError, match="Read-only file system"):  # the simulation holds
        (tmp_path / "cache" / "probe").write_text("x")
    again = extract(encoder, manifest, tmp_path / "images", tmp_path / "cache", shard_size=8, progress=False)
    assert again.n_forward == 0 and again.path == first.path
    np.testing.assert_array_equal(again.embeddings, first.embeddings)
    assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "cache").rglob("*")) == before


def test_an_incomplete_entry_in_a_read_only_cache_is_one_line_naming_paths_cache_dir(tmp_path, monkeypatch):
    import readonly_fs
    from feature_fixtures import engine_extract as extract  # the engine's entry: its shard files are named here
    from feature_fixtures import tiny_encoder, write_images

    from robustbench_fm.features import FeatureCacheError

    manifest = write_images(tmp_path / "images", n=20)
    first = extract(tiny_encoder(), manifest, tmp_path / "images", tmp_path / "cache", shard_size=8, progress=False)
    (first.path / "shard-00001.parquet").unlink()
    readonly_fs.install(tmp_path / "cache", monkeypatch.setattr)
    with pytest.raises(FeatureCacheError) as err:
        extract(tiny_encoder(), manifest, tmp_path / "images", tmp_path / "cache", shard_size=8, progress=False)
    assert str(err.value) == (
        f"feature cache '{tmp_path / 'cache'}' is not writable ([Errno 30] Read-only file system: "
        f"'{first.path.parent / (first.key + '.lock')}') and the entry of 'tiny' for this manifest needs writing "
        "(1 of 3 shards missing); set paths.cache_dir=<a writable folder>")


@pytest.fixture(scope="module")
def planted_cache(tmp_path_factory):
    """A small planted run whose cache entry is complete (planted_sharp, 40 images)."""
    out = tmp_path_factory.mktemp("planted")
    proc = cli(f"paths.output_root={out}", "dataset=planted", "encoder=planted_sharp", "dataset.options.n=40",
               "stage.params.n_boot=10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_cli_reads_a_read_only_cache_and_refuses_an_unwritable_one_in_one_line(planted_cache, tmp_path):
    import readonly_fs

    common = [f"paths.cache_dir={planted_cache / 'cache' / 'features'}", "dataset=planted", "dataset.options.n=40",
              f"dataset.root={planted_cache / 'demo_data' / 'planted'}", "stage.params.n_boot=10"]
    ok = subprocess.run(readonly_fs.cli_command(planted_cache / "cache", f"paths.output_root={tmp_path / 'a'}",
                                                "encoder=planted_sharp", *common),
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "cache hit: 40 rows, 0 forward passes" in ok.stdout and "images embedded" not in ok.stdout
    assert "| planted_sharp | marker | planted | marker | 20 | 20 | 0.000 |" in ok.stdout
    bad = subprocess.run(readonly_fs.cli_command(planted_cache / "cache", f"paths.output_root={tmp_path / 'b'}",
                                                 "encoder=planted_blur", *common),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one_error_line(bad) == (
        f"error: feature cache '{planted_cache / 'cache' / 'features'}' is not writable ([Errno 30] Read-only file "
        f"system: '{planted_cache / 'cache' / 'features' / 'planted_blur'}') and 'planted_blur' has 40 of 40 images "
        "of this manifest to embed; set paths.cache_dir=<a writable folder>")


def test_an_unwritable_output_folder_is_one_line_naming_paths_output_root(tmp_path):
    import readonly_fs

    out = tmp_path / "ro"
    out.mkdir()
    proc = subprocess.run(readonly_fs.cli_command(out, f"paths.output_root={out}", "hydra.run.dir=" + str(out / "run"),
                                                  "encoder=planted_sharp"),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one_error_line(proc) == (f"error: cannot write the output folder '{out / 'run'}' ([Errno 30] Read-only "
                                    f"file system: '{out / 'run'}'); set paths.output_root=<a writable folder>")
    sweep = subprocess.run(readonly_fs.cli_command(out, "-m", f"paths.output_root={out}", "encoder=planted_sharp"),
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = one_error_line(sweep)
    folder = line.split("'")[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", str(Path(folder).relative_to(out / "multirun")))
    assert line == (f"error: cannot write the output folder '{folder}' ([Errno 30] Read-only file system: "
                    f"'{out / 'multirun'}'); set paths.output_root=<a writable folder>")
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------ item 7: encoder.name=, stage.params.k

def compose_cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir

    from robustbench_fm.cli.main import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=[f"paths.root={tmp_path}", *overrides])


@pytest.mark.parametrize("override, message", [
    ("encoder.name=planted_sharpp", "error: encoder.name=planted_sharpp: unknown encoder 'planted_sharpp'; did you "
                                    "mean planted_sharp, planted_blur? Choose it with encoder=planted_sharp, not "
                                    "encoder.name="),
    ("encoder.name=planted_sharp", "error: encoder.name=planted_sharp does not choose the encoder (the experiment's "
                                   "panel would run); use encoder=planted_sharp"),
    ("stage.params.k=abc", "error: candor: stage.params.k=abc must be an integer (default: 5)"),
])
def test_cli_refuses_encoder_name_and_a_mistyped_k_in_one_line(tmp_path, override, message):
    proc = cli(f"paths.output_root={tmp_path}", override)
    assert one_error_line(proc) == message
    assert not (tmp_path / "demo_data").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("overrides, message", [
    (["stage=croma", "stage.params.k=abc"], "croma: stage.params.k=abc must be an integer or null (default: null)"),
    (["stage.params.shuffle_labels=3"], "candor: stage.params.shuffle_labels=3 must be true or false (default: false)"),
    (["stage.params.bank_size=[1,2]"], "candor: stage.params.bank_size=[1,2] must be an integer (default: 4000)"),
    (["stage=linear_head", "stage.params.lr=fast"],
     "linear_head: stage.params.lr=fast must be a number (default: 0.001)"),
])
def test_a_parameter_of_the_wrong_type_names_the_type(tmp_path, overrides, message):
    from robustbench_fm.pipeline.plan import plan

    with pytest.raises(ValueError) as err:
        plan(compose_cfg(tmp_path, *overrides), overrides)
    assert str(err.value) == message


def _entries(cache):
    """What a cache folder holds besides ``_files/`` (the content-hash memo the duplicate check writes
    while reading the manifest, before any image is embedded)."""
    return [p for p in cache.rglob("*") if p.is_file() and "_files" not in p.relative_to(cache).parts]


def test_a_k_no_matched_group_can_satisfy_is_refused_before_any_image_is_read(tmp_path):
    from robustbench_fm.cli import app

    overrides = ["dataset=planted", "encoder=planted_sharp", "dataset.options.n=40", "stage.params.k=1000"]
    cfg = compose_cfg(tmp_path, *overrides)
    with pytest.raises(ValueError) as err:
        app.run(cfg, tmp_path / "run", overrides)
    assert str(err.value) == (
        "candor: stage.params.k=1000 needs k+1=1001 positives and k+1 negatives in a matched group, but the best one "
        "has 20 positives and 20 negatives (finding 'marker', acq_group 'planted'); every row would be blank: use at "
        "most stage.params.k=19")
    assert not _entries(tmp_path / "outputs" / "cache")  # no image embedded (the files' hash memo aside)
    assert '"status": "failed"' in (tmp_path / "run" / "status.json").read_text()


def test_a_run_whose_every_row_is_blank_fails_naming_the_reason(own_features, tmp_path):
    """Here the k check passes (30 positives, 30 negatives) but exclude_patient leaves no query
    k candidates when every image is one patient's."""
    import pandas as pd

    from robustbench_fm.cli import app
    from robustbench_fm.core.errors import UserError

    feats, manifest = own_features
    pd.read_csv(manifest).assign(patient_id="p0").to_csv(manifest, index=False)
    overrides = ["experiment=from_features", f"features_file={feats}", f"manifest_file={manifest}",
                 "stage.findings=[marker]", "stage.params.group_col=site", "stage.params.exclude_patient=true",
                 "stage.params.n_boot=0"]
    with pytest.raises(UserError) as err:
        app.run(compose_cfg(tmp_path, *overrides), tmp_path / "run", overrides)
    assert str(err.value) == (
        "candor: none of the 2 result rows could be scored; encoder 'feats', finding 'marker', acq_group 'a': no query "
        "keeps k candidates in both banks; check stage.params and stage.findings")
    assert pd.read_parquet(tmp_path / "run" / "summary.parquet")["n_queries"].tolist() == [0, 0]


@pytest.mark.slow
def test_cli_k_too_large_exits_2_in_one_line(tmp_path):
    proc = cli(f"paths.output_root={tmp_path}", "dataset=planted", "encoder=planted_sharp", "dataset.options.n=40",
               "stage.params.k=1000")
    assert one_error_line(proc) == (
        "error: candor: stage.params.k=1000 needs k+1=1001 positives and k+1 negatives in a matched group, but the "
        "best one has 20 positives and 20 negatives (finding 'marker', acq_group 'planted'); every row would be "
        "blank: use at most stage.params.k=19")
    assert not _entries(tmp_path / "cache")  # no image embedded (the files' hash memo aside)


# ------------------------------------------------------------------ item 11: paths with spaces / non-ASCII

@pytest.mark.parametrize("args, message", [
    (["dataset.root=/data/my", "scans"],  # bash split the unquoted value at the space
     """error: could not parse override 'dataset.root=/data/my scans': quote values with spaces or special """
     """characters: 'dataset.root="/data/my scans"'"""),
    (["dataset.root=/data/données"],
     """error: could not parse override 'dataset.root=/data/données': quote values with spaces or special """
     """characters: 'dataset.root="/data/données"'"""),
    (["k=1000"], "error: there is no setting 'k' (in override 'k=1000'); did you mean stage.params.k=1000?"),
])
def test_cli_an_unparsable_override_gets_the_quoting_that_works(tmp_path, args, message):
    proc = cli(f"paths.output_root={tmp_path}", *args)
    assert one_error_line(proc) == message
    assert not (tmp_path / "runs").exists()


def test_check_overrides_quotes_for_bash_and_lets_valid_overrides_through():
    from robustbench_fm.cli.main import check_overrides

    assert check_overrides(["dataset.root=/data/x(1)"]) == (
        """could not parse override 'dataset.root=/data/x(1)': quote values with spaces or special characters: """
        """'dataset.root="/data/x(1)"'""")
    assert check_overrides(["encoder=uni", "dataset.root=/data/O'Brien", "scans"]) == (
        """could not parse override 'dataset.root=/data/O'Brien scans': quote values with spaces or special """
        """characters: 'dataset.root="/data/O'"'"'Brien scans"'""")
    assert check_overrides(["n_boot=10"]) == ("there is no setting 'n_boot' (in override 'n_boot=10'); did you mean "
                                              "stage.params.n_boot=10?")
    assert check_overrides(["dataset.root=/data/my scans"]) is None  # one quoted argument: Hydra reads it
    for ok in (['dataset.root="/tmp/my scans/données"'], ["-m", "encoder=planted_blur,planted_sharp"],
               ["experiment=collect", "sweep_dir=/x", "compare=true"], ["+stage.params.extra=1"],
               ["extract.num_shards=8", "extract.shard=range(8)"], ["hydra.run.dir=/tmp/x", "dry_run=true"],
               ["panel=candor_chest", "launcher=slurm", "hydra.launcher.partition=gpu"], ["--help"]):
        assert check_overrides(ok) is None, ok


@pytest.mark.slow
def test_a_quoted_path_with_spaces_and_non_ascii_runs_end_to_end_in_bash(tmp_path):
    """The quoting the error suggests, pasted into bash, runs the planted dataset there."""
    import shlex

    root = tmp_path / "my scans" / "données"
    unquoted = cli(f"paths.output_root={tmp_path / 'out'}", f"dataset.root={root}")
    suggested = one_error_line(unquoted).rsplit(": ", 1)[1]
    assert suggested == f"""'dataset.root="{root}"'"""
    out = tmp_path / "sortie ü"
    command = (f"{shlex.quote(sys.executable)} -m robustbench_fm {suggested} 'paths.output_root=\"{out}\"' "
               "dataset=planted encoder=planted_sharp dataset.options.n=40 stage.params.n_boot=10")
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "labels.csv").is_file() and len(list((root / "images").glob("*.png"))) == 40
    run = next((out / "runs").glob("*/*"))
    assert (run / "report.html").is_file() and f"report: {run / 'report.html'}" in proc.stdout
    assert "| planted_sharp | marker | planted | marker | 20 | 20 | 0.000 |" in proc.stdout
