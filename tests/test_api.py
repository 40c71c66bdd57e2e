"""The Python API takes what the command line takes: ``robustbench_fm.embed(decode=...)`` is
``extract.decode`` (issue 44 item 1), with the same default and the same check."""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from feature_fixtures import write_jpeg_films

import robustbench_fm
from robustbench_fm import encoders
from robustbench_fm.core.errors import InvalidSetting
from robustbench_fm.data.images import DEFAULT_DECODE, need_of, read_image

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "config.yaml"


def test_embeds_decode_default_is_the_command_lines():
    default = inspect.signature(robustbench_fm.embed).parameters["decode"].default
    assert default == DEFAULT_DECODE == yaml.safe_load(CONFIG.read_text())["extract"]["decode"]


def test_a_bad_decode_is_one_line_before_anything_is_read(tmp_path):
    with pytest.raises(InvalidSetting) as err:
        robustbench_fm.embed(tmp_path / "absent.csv", "planted_blur", decode="fast", cache_dir=tmp_path / "c")
    assert str(err.value).startswith("embed: decode='fast': use scaled") and "\n" not in str(err.value)


def _films(root: Path, n: int = 3) -> pd.DataFrame:
    """Grey 1,024 px JPEG films: planted_blur's 224 px resize leaves a 1/2 decode."""
    paths = write_jpeg_films(root, n)
    return pd.DataFrame({"sample_id": [f"f{i}" for i in range(n)], "path": paths})


def test_embed_decodes_jpegs_as_decode_says_and_keys_it(tmp_path):
    manifest = _films(tmp_path / "films")
    root, cache = tmp_path / "films", tmp_path / "cache"
    scaled = robustbench_fm.embed(manifest, "planted_blur", root, cache_dir=cache, device="cpu", batch_size=4)
    exact = robustbench_fm.embed(manifest, "planted_blur", root, cache_dir=cache, device="cpu", batch_size=4,
                                 decode="exact")
    assert scaled.fields["recipe"]["decode"] == "scaled" and "decode" not in exact.fields["recipe"]
    assert exact.n_images_embedded == len(manifest)  # an exact request is never served the scaled entry
    enc = encoders.load("planted_blur", device="cpu")
    need = need_of(**{k: enc.spec.preprocessing()[k] for k in ("resize", "input_size", "resize_size")})
    rows = manifest.to_dict("records")
    for got, want_need in ((exact.embeddings, None), (scaled.embeddings, need)):
        want = enc.embed(torch.stack([enc.transform(read_image(root, r, want_need)) for r in rows])).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert read_image(root, rows[0], need).size == (512, 512)  # the scaled path did decode at 1/2
    assert not np.array_equal(scaled.embeddings, exact.embeddings)


IMPORT_THEN_RUN = """
import sys
import robustbench_fm
from robustbench_fm.core.errors import UserError
print(sorted(m for m in ("hydra", "omegaconf", "torch") if m in sys.modules))
try:  # composes chest_candor (its stage= / encoder= options and ${launch_dir:}) and checks every job's data
    robustbench_fm.run("chest_candor", ["encoders=[planted_blur,planted_sharp]", "stage=candor", "device=cpu"])
except UserError as exc:
    print(exc)
print(robustbench_fm.api.Outcome.__name__)
"""


def test_importing_the_package_imports_no_hydra_and_run_registers_what_it_composes_with(tmp_path):
    """Issue 56: ``import robustbench_fm`` imports neither Hydra nor OmegaConf and registers nothing;
    ``robustbench_fm.run`` registers the configs' resolvers and generated options itself (a fresh
    process, without the suite's registration): the shipped experiment composes, ``paths.root`` is
    the folder it was run from, and every job's missing data is refused before anything runs."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", IMPORT_THEN_RUN], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported, refused, outcome = proc.stdout.strip().splitlines()
    assert imported == "[]"
    assert refused.startswith("nothing was run: 4 of 4 jobs fail their checks (2 distinct problems)")
    assert f"root '{tmp_path}/data/mimic-cxr-jpg/2.1.0' does not exist" in refused
    assert outcome == "Outcome"
    assert not (tmp_path / "outputs").exists()
