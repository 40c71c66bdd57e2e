"""Issue 56 item 4: the typed stage parameters the plan builds (each stage's StageParams, parsed once
from the config) are the object the stage receives: its ``run`` and ``check_manifest`` get it as their
``params`` argument and a ``run_job`` stage's JobContext holds it; each stage's command-line config
node is its class's fields (a field added in one place only fails here)."""
import inspect

import numpy as np
import pandas as pd
import pytest
from plan_fixtures import OVERRIDES, compose_job

from robustbench_fm import methods
from robustbench_fm.methods.candor.params import CandorParams
from robustbench_fm.methods.params import as_config, with_params
from robustbench_fm.pipeline import job
from robustbench_fm.pipeline.configstore import stage_node
from robustbench_fm.pipeline.plan import plan

SHIPPED = [n for n in methods.names() if methods.method(n).params is not None
           and methods.method(n).module.startswith("robustbench_fm.")]


class _Seen(Exception):
    pass


def test_the_candor_stage_receives_the_plans_typed_parameters_unchanged(tmp_path, monkeypatch):
    p = plan(compose_job(tmp_path), OVERRIDES)
    assert isinstance(p.params, CandorParams) and p.params.k == 3  # stage.params.k=3, parsed once
    module = methods.get("candor")
    seen = []

    def spy(*args, params=None, **kw):
        seen.append(params)
        raise _Seen

    monkeypatch.setattr(module, "run", spy)
    monkeypatch.setattr(module, "check_manifest", spy)
    manifest = pd.DataFrame({"sample_id": ["a", "b"], "path": ["a.png", "b.png"], "marker": [0, 1],
                             "acq_group": "g", "patient_id": ["p", "q"]})
    with pytest.raises(_Seen):
        job._check_scorable(p, manifest)
    with pytest.raises(_Seen):
        job._stage_results(p, np.zeros((2, 4), np.float32), manifest, tmp_path, "planted_sharp", "planted")
    assert len(seen) == 2 and all(s is p.params for s in seen)
    assert methods.get("candor").PARAMS.parse(p.params) is p.params  # a run_job stage's parse: the same object


@pytest.mark.parametrize("name", SHIPPED)
def test_each_stage_takes_its_typed_parameters_and_its_config_node_is_their_fields(name):
    cls = methods.method(name).params
    default = cls.parse({})
    assert list(stage_node(name)["params"]) == list(as_config(default))  # config node == the class's cli fields
    module = methods.get(name)
    fns = [getattr(module, f) for f in ("run", "check_manifest") if hasattr(module, f)]
    if not hasattr(module, "run_job"):
        for fn in fns:  # the object goes in as ``params``, not as keywords parsed again
            declared = inspect.signature(fn).parameters.get("params")
            assert declared is not None and declared.kind is not inspect.Parameter.VAR_KEYWORD, fn
            got = []
            with_params(lambda *a, params=None, **kw: got.append(params), default)
            assert got == [default] and got[0] is default


def test_a_plugin_run_declaring_only_keywords_gets_the_fields_as_keywords():
    got = {}

    def run(features, manifest, finding, **params):
        got.update(params)

    with_params(run, CandorParams(k=7), None, None, finding="f")
    assert got["k"] == 7 and set(got) == set(CandorParams.names())
