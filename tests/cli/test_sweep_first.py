"""``JobContext.sweep_first``: in a multirun, rows that do not depend on the swept encoder (SPAR's
planted oracle) are computed by the first job of the encoder fan-out only, not once per job."""
import dataclasses

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict

from robustbench_fm.cli import app
from robustbench_fm.cli.main import CONFIG_DIR
from robustbench_fm.pipeline.job import sweep_first
from robustbench_fm.pipeline.plan import plan


def _first(encoder: str, mode: RunMode | None) -> bool:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", return_hydra_config=True, overrides=["experiment=spar_demo", f"encoder={encoder}"])
    job = plan(cfg, [f"encoder={encoder}"])  # reads the swept panel (cfg.encoders) into the plan
    assert job.encoders == [encoder] and job.swept_encoders == tuple(cfg.encoders)
    instance = HydraConfig.instance()
    before = instance.cfg
    try:
        if mode is None:
            instance.cfg = None
        else:
            with open_dict(cfg):
                cfg.hydra.mode = mode
            instance.set_config(cfg)
        # the command line's job reads the mode from Hydra once (app.hydra_mode) into the plan
        return sweep_first(dataclasses.replace(job, multirun=app.hydra_mode()[0]))
    finally:
        instance.cfg = before


def test_only_the_first_encoder_of_a_multirun_fan_out_is_the_sweeps_first_job():
    panel = ["resnet50_in1k", "vit_b32_in1k", "random_vit_s"]  # configs/panel/spar_demo.yaml, in order
    assert [_first(e, RunMode.MULTIRUN) for e in panel] == [True, False, False]
    # a single run (or no Hydra at all, e.g. the Python API) computes everything itself
    assert [_first(e, RunMode.RUN) for e in panel] == [True, True, True]
    assert _first("vit_b32_in1k", None) is True
