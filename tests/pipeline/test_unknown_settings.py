"""Issue 41 item 1 and 9: a key nothing reads (``+stage.parms.k=3``, the fix Hydra itself prints for
the typo ``stage.parms.k=3``) used to run with the default and exit 0. plan() refuses every
unknown key under stage, stage.params, dataset, dataset.options, extract and encoder with the
closest real key; the command line turns Hydra's "Could not override" into one line naming it."""
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from robustbench_fm.cli.main import CONFIG_DIR, _known_path, _settings, check_overrides
from robustbench_fm.core.errors import UserError
from robustbench_fm.pipeline.plan import plan as plan_job


def plan(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", *overrides])
    return plan_job(cfg, list(overrides))


@pytest.mark.parametrize("override, message", [
    ("+stage.parms.k=3", "unknown setting stage.parms.k: the run would ignore it; did you mean stage.params.k=3?"),
    ("+stage.params.kk=3", "candor: unknown parameter stage.params.kk; did you mean k?"),
    ("+dataset.options.nn=3", "dataset 'planted': no option dataset.options.nn; did you mean dataset.options.n?"),
    ("+dataset.optons.n=3", "unknown setting dataset.optons.n: the run would ignore it; did you mean "
                            "dataset.options.n=3?"),
    ("+extract.batchsize=3", "unknown setting extract.batchsize: the run would ignore it; did you mean "
                             "extract.batch_size=3?"),
    ("++encoder.weight=/w", "unknown setting encoder.weight: the run would ignore it; did you mean "
                            "encoder.weights=/w?"),
    ("+stage.foo=1", "unknown setting stage.foo: the run would ignore it; stage holds name, findings, params"),
])
def test_a_key_nothing_reads_is_refused_in_plan_with_the_real_key(tmp_path, override, message):
    with pytest.raises(UserError) as err:
        plan(tmp_path, override)
    text = str(err.value)
    assert text.startswith(message) and "\n" not in text, text


def test_the_real_keys_still_plan(tmp_path):
    job = plan(tmp_path, "stage.params.k=3", "extract.batch_size=7", "dataset.options.n=20", "encoder.batch_size=2")
    assert job.params.k == 3 and job.extract.batch_size == 7 and job.dataset_options["n"] == 20


@pytest.mark.parametrize("argv, line", [
    (["stage.parms.k=3"], "there is no setting 'stage.parms.k' (in override 'stage.parms.k=3'); "
                          "did you mean stage.params.k=3?"),
    (["extract.batchsize=64"], "there is no setting 'extract.batchsize' (in override 'extract.batchsize=64'); "
                               "did you mean extract.batch_size=64?"),
    # item 9: the group, not encoders= / encoder.name= (which plan refuses)
    (["encodr=planted_sharp"], "there is no setting 'encodr' (in override 'encodr=planted_sharp'); "
                               "did you mean encoder=planted_sharp?"),
    (["datset=csv"], "there is no setting 'datset' (in override 'datset=csv'); did you mean dataset=csv?"),
    (["k=1000"], "there is no setting 'k' (in override 'k=1000'); did you mean stage.params.k=1000?"),
])
def test_hydra_could_not_override_becomes_one_line_with_the_nearest_key(argv, line):
    assert check_overrides(argv) == line


@pytest.mark.parametrize("experiment", [p.stem for p in sorted((CONFIG_DIR / "experiment").glob("*.yaml"))
                                        if p.stem != "collect"])
def test_every_setting_of_every_shipped_experiment_passes_the_check(experiment):
    """No false alarm: every leaf of each composed experiment is a known path, so check_overrides
    lets its override through."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}"])
    paths = _settings()[1]
    flat = OmegaConf.to_container(cfg, resolve=False)

    def leaves(node, prefix):
        if isinstance(node, dict) and node:
            return [p for k, v in node.items() for p in leaves(v, f"{prefix}.{k}" if prefix else str(k))]
        return [prefix]

    unknown = [p for p in leaves(flat, "") if "." in p and not p.startswith("hydra.") and not _known_path(p, paths)]
    assert unknown == []


def test_device_cuda_without_cuda_is_refused_in_plan_before_any_data(tmp_path, monkeypatch):
    """Issue 41 item 7: checked in plan(), before any data is read; a job that runs elsewhere (a
    finished job's manifest, a launcher's node) is not refused here."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^device=cuda: this machine has no usable CUDA device"):
        plan(tmp_path, "device=cuda")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.root={tmp_path}", "device=cuda"])
    assert plan_job(cfg, ["device=cuda"], here=False).extract.device == "cuda"


@pytest.mark.parametrize("rows, message", [
    ("", "the CSV has 0 rows (only its header); add one row per image"),
    ("a.png,2\nb.png,0\n", "no finding column: column 'grade' was skipped (value '2'; a finding column holds 1, 0 "
                           "or empty)"),
])
def test_a_csv_without_finding_columns_names_why_in_plan(tmp_path, rows, message):
    """Issue 41 items 5 and 6: "no finding to score ... dataset=pool ... stage.findings=[pneumothorax]" before."""
    csv = tmp_path / "labels.csv"
    csv.write_text("path,grade\n" + rows)
    with pytest.raises(UserError) as err:
        plan(tmp_path, "dataset=csv", f"dataset.manifest={csv}")
    assert str(err.value).startswith(f"{csv}: {message}"), str(err.value)
