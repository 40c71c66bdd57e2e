"""robustbench_fm.pipeline.job: running a job's Plan. No step of the run takes the config: the two
entry points that take one (run, job_manifest) only hand it to plan(); the extraction service
and the stage's context are built from the Plan alone."""
import ast
import inspect
import math
import textwrap

import pandas as pd
import pytest
from plan_fixtures import OVERRIDES, compose_job

from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.pipeline import job
from robustbench_fm.pipeline.plan import Plan, plan


def test_the_extraction_service_and_the_stage_context_are_built_from_the_plan_alone(tmp_path):
    p = plan(compose_job(tmp_path), OVERRIDES)
    service = job.embedder(p)
    assert service.extract is p.extract  # the plan's options, handed over unchanged (issue 56)
    assert (service.cache_dir, service.extract.device, service.extract.batch_size, service.extract.on_bad_image) == (
        p.paths.cache_dir, "cpu", 7, "skip")
    assert (service.resolution, service.prepared_dir, service.extract.allow_remote_code) == (
        224, p.paths.prepared_dir, False)
    assert service.batch_size_of("planted_sharp") == 3 and service.batch_size_of("planted_blur") == 7
    assert job.encoder_options(p)[0] == "planted_sharp"
    assert service.extract.decode == p.extract.decode == "scaled"  # configs/config.yaml: extract.decode
    assert service.store().options is p.extract  # and on to the feature store
    exact = plan(compose_job(tmp_path, [*OVERRIDES, "extract.decode=exact"]), OVERRIDES)
    assert exact.extract.decode == job.embedder(exact).extract.decode == "exact"


#: the functions of pipeline/job.py that take a config: each hands it to plan() and nothing else
ENTRY_POINTS = ("run", "job_manifest")


def _steps() -> list:
    return [f for _, f in inspect.getmembers(job, inspect.isfunction)
            if f.__module__ == job.__name__ and f.__name__ not in ENTRY_POINTS]


def test_no_step_of_the_run_takes_the_config():
    """Every function of pipeline/job.py (the manifest, the extraction service, the stage, the
    results, the report) takes the Plan, never a DictConfig; so do the Plan's own methods."""
    steps = _steps()
    names = {f.__name__ for f in steps}
    assert {"embedder", "encoder_options", "extract_panel", "load_manifest", "job_context", "run_planned",
            "run_stage_on_entries", "_write_report", "_record_part"} <= names
    for f in [*steps, Plan.describe]:
        for p in inspect.signature(f).parameters.values():
            assert p.name != "cfg" and "DictConfig" not in str(p.annotation), f"{f.__name__}({p.name}: {p.annotation})"
    for name in ("embedder", "encoder_options", "extract_panel", "load_manifest", "run_planned", "job_context"):
        first = next(iter(inspect.signature(getattr(job, name)).parameters.values()))
        assert first.annotation in ("Plan", Plan), name


def test_the_entry_points_hand_the_config_to_plan_and_read_nothing_of_it():
    """``run`` and ``job_manifest`` take a config and use it once: as plan()'s first argument
    (plan() is the one reader of the config)."""
    for name in ENTRY_POINTS:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(job, name))))
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "cfg"]
        handed = [c.args[0] for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                  and c.func.id == "plan" and c.args and isinstance(c.args[0], ast.Name) and c.args[0].id == "cfg"]
        assert len(uses) == len(handed) == 1, name


def test_a_row_scored_in_part_is_not_refused_as_blank():
    """Every row carries a reason: refused when the headline metrics are blank too (CANDOR's
    unscored rows), kept when some headline metric is scored (CRoMa refused on a collapsed
    embedding, its RI and MaRI reported; issue 42 item 3)."""
    reason = "CRoMa not computed (RI and MaRI are): 80/80 units have a zero margin denominator"
    partial = pd.DataFrame([dict(finding="bio_label", ri=0.5, mari=0.5, croma=math.nan, f0=math.nan,
                                 ltm=math.nan, reason=reason)])
    job._refuse_all_blank("croma", partial)  # no error
    blank = partial.assign(ri=math.nan, mari=math.nan)
    with pytest.raises(InvalidSetting, match="none of the 1 result rows could be scored.*CRoMa not computed"):
        job._refuse_all_blank("croma", blank)
