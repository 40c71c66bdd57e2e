"""Hub code runs only when the user opts in (issue 54, item 8): ``security.allow_remote_code`` is false
by default, in the config and in the Python API (one home: ``encoders.spec.ALLOW_REMOTE_CODE``); an entry
that needs its authors' hub code is refused in one line naming ``security.allow_remote_code=true``,
before any weights are looked up or downloaded."""
import inspect
from pathlib import Path

import cli_process
import pytest
import yaml

from robustbench_fm import encoders
from robustbench_fm.core.errors import UserError
from robustbench_fm.encoders import generic, spec

ROOT = Path(__file__).resolve().parents[2]
#: the catalog's entries that run code from the hub (docs/encoders.md, "Weights, packages and choices")
REMOTE = {"hibou_b", "hibou_l", "genbio_pathfm", "conch_v1_5", "prism", "titan"}


def test_remote_code_is_off_by_default_in_the_config_and_the_api():
    config = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
    assert config["security"]["allow_remote_code"] is False
    assert spec.ALLOW_REMOTE_CODE is False and encoders.ALLOW_REMOTE_CODE is False
    for fn in (encoders.load, encoders.load_slide, generic.load):
        assert inspect.signature(fn).parameters["allow_remote_code"].default is False, fn


def test_the_six_hub_code_entries_are_those_the_docs_name():
    assert {n for n in encoders.names() if encoders.get(n).trust_remote_code} == REMOTE
    docs = " ".join((ROOT / "docs" / "encoders.md").read_text().split())
    assert "security.allow_remote_code=true" in docs and "remote code is off by default" in docs
    assert all(f"`{name}`" in docs for name in REMOTE)


@pytest.mark.parametrize("name", sorted(REMOTE))
def test_a_hub_code_entry_is_refused_by_default_before_any_weights(monkeypatch, name):
    def no_loader(library):
        raise AssertionError(f"the {library} loader was reached: weights would be looked up or downloaded")

    monkeypatch.setattr(encoders, "loader", no_loader)
    load = encoders.load_slide if encoders.get(name).is_slide else encoders.load
    # a weights path that does not exist: the refusal comes first, not the missing file
    with pytest.raises(encoders.RemoteCodeRefused) as err:
        load(name, weights="/nonexistent/weights.safetensors", device="cpu")
    msg = str(err.value)
    assert isinstance(err.value, UserError) and isinstance(err.value, PermissionError)
    assert "\n" not in msg and f"encoder '{name}'" in msg and encoders.get(name).hub_id in msg
    assert "security.allow_remote_code=true" in msg and "(the default)" in msg
    with pytest.raises(AssertionError, match="loader was reached"):  # opted in: it goes on to the loader
        load(name, device="cpu", allow_remote_code=True)


def test_an_entry_without_hub_code_loads_with_the_default():
    assert not encoders.get("planted_blur").trust_remote_code
    assert encoders.load("planted_blur", device="cpu").spec.name == "planted_blur"


@pytest.mark.slow  # the command line end to end
def test_the_command_line_refuses_a_hub_code_entry_in_one_line_and_exits_2(tmp_path):
    run = cli_process.run(["-m", "robustbench_fm", "encoder=hibou_b", f"paths.output_root={tmp_path}",
                           "device=cpu"], cwd=ROOT, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: encoder 'hibou_b' runs its authors' code from the Hugging Face hub")
    assert "security.allow_remote_code=true" in last and "a bug" not in run.stderr


def test_every_python_entry_point_defaults_to_no_hub_code():
    """The Python API, the Embedder service and the slide extractor take the one default (issue 54 item 8)."""
    import dataclasses
    import inspect

    from robustbench_fm import api
    from robustbench_fm.features import embed, options, slides

    assert inspect.signature(api.embed).parameters["allow_remote_code"].default is False
    # the Embedder and the slide extractor take the one ExtractOptions (issue 56): its field's default
    field = {f.name: f for f in dataclasses.fields(options.ExtractOptions)}["allow_remote_code"]
    assert field.default is False and options.DEFAULTS.allow_remote_code is False
    assert {f.name: f for f in dataclasses.fields(embed.Embedder)}["extract"].default is options.DEFAULTS
    assert inspect.signature(slides.extract_slides).parameters["options"].default is None  # -> ExtractOptions()
