"""Untrusted code and files (issue: reliability 7): remote code only when allowed, checkpoints
never unpickle code, manifest paths stay inside the root, secrets never reach saved configs or
logs, and importing the package opens no network connection."""
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cli_process
import pandas as pd
import pytest
import torch

from robustbench_fm import encoders
from robustbench_fm.core.redact import install_log_redaction, is_secret_key, redact_config
from robustbench_fm.data import manifest as mf
from robustbench_fm.encoders.registry import SPECS

pytestmark = pytest.mark.slow  # command-line subprocesses: the full suite runs them

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_" + "Q" * 34


def test_remote_code_is_refused_when_the_user_turns_it_off(monkeypatch):
    spec = encoders.get("rad_dino").replace(name="remote_entry", trust_remote_code=True)
    monkeypatch.setitem(SPECS._entries, "remote_entry", spec)
    with pytest.raises(PermissionError, match="security.allow_remote_code is false"):
        encoders.load("remote_entry", allow_remote_code=False)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["random_vit_s", "planted_sharp"])
def test_pickled_code_in_a_checkpoint_is_never_run(tmp_path, name):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "evil.pth"
    torch.save({"weight": _Payload(marker)}, ckpt)
    with pytest.raises(Exception):
        encoders.load(name, weights=ckpt, device="cpu")
    assert not marker.exists()


@pytest.mark.parametrize("path, problem", [
    ("/etc/passwd", "'/etc/passwd' is an absolute path; store each path relative to the dataset root"),
    ("../../etc/passwd", "'../../etc/passwd' climbs out of the dataset root with '..'"),
    ("imgs/../../x.png", "'imgs/../../x.png' climbs out of the dataset root with '..'"),
])
def test_manifest_paths_cannot_escape_the_root(tmp_path, path, problem):
    """Issue 41 item 10: the message says the real rule (an absolute path, even one inside the
    root, is refused as absolute; '..' as climbing out)."""
    pd.DataFrame({"sample_id": ["a"], "path": [path]}).to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(mf.ManifestError) as err:
        mf.read(tmp_path / "m.csv")
    assert f"column 'path', row 0: {problem}" in str(err.value)


def test_log_lines_mask_tokens(caplog):
    with caplog.at_level(logging.INFO, logger="robustbench_fm"):
        install_log_redaction()
        logging.getLogger("robustbench_fm").info("fetching with %s and password=hunter2xyz", TOKEN)
    text = caplog.text
    assert TOKEN not in text and "hunter2xyz" not in text and "***" in text


def test_saved_config_and_dry_run_never_hold_tokens(tmp_path):
    base = ["-m", "robustbench_fm", f"paths.output_root={tmp_path}", f"+hub.token={TOKEN}",
            f"+note='use token={TOKEN}'"]
    dry = cli_process.run(base + ["dry_run=true"], cwd=ROOT, timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert TOKEN not in dry.stdout + dry.stderr and "token: '***'" in dry.stdout
    run = cli_process.run(base + ["encoders=[planted_blur]", "stage.params.n_boot=10"], cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".yaml", ".log", ".json", ".md")]
    assert any(p.name == "config.yaml" for p in saved)
    for p in saved:
        assert TOKEN not in p.read_text(errors="ignore"), p
    assert not list(tmp_path.rglob(".hydra"))


def test_importing_the_package_opens_no_connection():
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise RuntimeError("network access at import time")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        import robustbench_fm, robustbench_fm.encoders, robustbench_fm.data, robustbench_fm.features
        import robustbench_fm.methods, robustbench_fm.cli.app
        from robustbench_fm import encoders
        assert len(encoders.names()) >= 7
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("key, secret", [
    ("token", True), ("hf_token", True), ("hubToken", True), ("api_key", True), ("apiKey", True),
    ("apikey", True), ("password", True), ("db_passwd", True), ("client_secret", True), ("aws_secret_access_key", True),
    ("credentials", True),
    ("token_grid", False), ("tile_token_grid", False), ("max_tokens", False), ("n_tokens", False),
    ("keys", False), ("key", False), ("sort_key", False), ("cluster_col", False)])
def test_a_key_is_masked_only_when_it_names_a_secret(key, secret):
    """SPAR's token_grid is a setting (a saved config.yaml must re-run the experiment), hf_token a secret."""
    assert is_secret_key(key) is secret
    assert redact_config({"stage": {key: [4, 4]}})["stage"][key] == ("***" if secret else [4, 4])
