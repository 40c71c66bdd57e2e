"""Every command in the fenced code blocks of README.md and of every page under docs/, run exactly
as written, in order (README.md first, then the pages in :data:`PAGES` order: later pages read what
earlier ones wrote), in one scratch working directory (a newcomer's shell after ``cd`` into a
fresh clone: ``scripts/`` is there, ``outputs/`` is not). No command is shown twice, so none runs
twice; README.md stays at most 200 lines and every relative link of these pages resolves.

* ``bash`` blocks: each command (``\\`` continuations joined) runs through ``bash -c``; it must exit 0.
  Where a command needs data or weights that cannot ship with the repository, :data:`SUBSTITUTES`
  appends overrides to it (never edits it) and says why; nothing else is changed.
* ``python`` blocks run as scripts with ``python -``, in the same folder.
* ``text`` blocks are output or layouts, not commands; a block without a language is refused, so
  nothing the README or the docs show escapes this test.
* The two set-up commands (``python3 -m venv ... && pip install ... && <command>``): the install
  prefix is what ``.ci/run`` does on every submission (checked to be the same command); the demo
  after the install runs as written in tests/cli/test_demo.py (:data:`RUN_BY`, which also asserts the
  README's table of what it prints; here only the images it leaves are written, :data:`LEAVES`), the
  test command is this suite itself.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cli_process
import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: the pages whose blocks run, in the order they run: the README first (the demo's images and
#: ``my_labels.csv``, which later pages read), then docs/ (encoders.md fills the feature-cache entry
#: python-api.md's ``embed`` reads back); every page under docs/ must be listed
PAGES = ("README.md", "docs/encoders.md", "docs/python-api.md", "docs/datasets.md",
         "docs/sweeps-and-clusters.md", "docs/methods/candor.md", "docs/methods/croma.md",
         "docs/methods/confounders.md", "docs/methods/spar.md", "docs/outputs.md", "docs/development.md",
         "docs/architecture.md", "docs/comparisons.md", "docs/neighbourhoods.md")
README_MAX_LINES = 200
BLOCK = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
SETUP = re.compile(r"^python3 -m venv \.venv && \. \.venv/bin/activate && pip install (?P<what>.+?) && (?P<cmd>.+)$")


def blocks() -> list[tuple[str, str, str]]:
    """(page, language, body) of every fenced block of :data:`PAGES`, in running order."""
    return [(page, lang.strip(), body) for page in PAGES
            for lang, body in BLOCK.findall((REPO / page).read_text())]


def shown_commands() -> list[str]:
    """Every command of every ``bash`` block of :data:`PAGES`, in order."""
    return [c for _, lang, body in blocks() if lang == "bash" for c in commands(body)]


def commands(body: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [c for c in (_strip_comment(line) for line in joined.splitlines()) if c]


def _strip_comment(line: str) -> str:
    """The line without its trailing ``# comment`` (a ``#`` outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def _chest_data(data_dir: Path) -> None:
    """MIMIC-CXR-JPG and CheXpert in their released layouts (two views each, 12 findings, a planted
    marker on the edema positives), MS-CXR boxes on MIMIC's pneumothorax positives and an RSNA
    pneumonia copy: what ``paths.data_dir=/data`` holds for ``experiment=chest_candor``."""
    sys.path.insert(0, str(REPO / "tests" / "methods" / "candor"))
    from chest_fixtures import write_rsna_pneumonia
    from test_chest_candor_e2e import write_chexpert, write_mimic

    rng = np.random.default_rng(0)
    mimic = data_dir / "mimic-cxr-jpg" / "2.1.0"
    write_mimic(mimic, rng)
    write_chexpert(data_dir / "CheXpert-v1.0-small", rng)
    meta = pd.read_csv(mimic / "mimic-cxr-2.0.0-metadata.csv.gz")
    labels = pd.read_csv(mimic / "mimic-cxr-2.0.0-chexpert.csv.gz")
    pos = meta.merge(labels, on=["subject_id", "study_id"]).query("Pneumothorax == 1")
    rows = [{"dicom_id": r.dicom_id, "category_name": "Pneumothorax", "label_text": "pneumothorax",
             "path": f"files/p{str(r.subject_id)[:2]}/p{r.subject_id}/s{r.study_id}/{r.dicom_id}.jpg",
             "x": 10, "y": 10, "w": 40, "h": 30, "image_width": 112, "image_height": 112, "split": "train"}
            for r in pos.itertuples()]
    folder = mimic / "ms-cxr" / "1.1.0"
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "MS_CXR_Local_Alignment_v1.1.0.csv", index=False)
    write_rsna_pneumonia(data_dir / "rsna-pneumonia-detection-challenge")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The scratch working directory: a clone's ``scripts/`` and nothing else."""
    cwd = tmp_path_factory.mktemp("newcomer")
    (cwd / "scripts").symlink_to(REPO / "scripts")
    return cwd


#: command as written in the README -> (overrides appended, why). Only data and weights that
#: cannot ship are substituted, always by appending (a later override wins in Hydra).
NO_DATA = "the datasets cannot ship: the same layouts, generated under ./data"
NO_WEIGHTS = "no weights can be downloaded here: cheap encoders of the same interface instead"
SLURM = "no Slurm here: the dry run lists the jobs and launcher settings it would submit"
SUBSTITUTES: dict[str, tuple[str, str]] = {
    "python -m robustbench_fm experiment=chest_candor paths.data_dir=/data":
        ("paths.data_dir=data encoders=[planted_blur,planted_sharp]", f"{NO_DATA}; {NO_WEIGHTS}"),
    "python -m robustbench_fm panel=candor_chest dataset=chexpert dataset.root=/data/CheXpert-v1.0-small":
        ("dataset.root=data/CheXpert-v1.0-small encoders=[planted_blur,random_vit_s]", f"{NO_DATA}; {NO_WEIGHTS}"),
    "python -m robustbench_fm dataset=chexpert dataset.root=/data/CheXpert-v1.0-small encoder=rad_dino "
    "encoder.weights=/data/weights/rad-dino":
        ("dataset.root=data/CheXpert-v1.0-small encoder=random_vit_s encoder.weights=null",
         f"{NO_DATA}; {NO_WEIGHTS}"),
    "python -m robustbench_fm dataset=cub dataset.root=/data/CUB_200_2011 encoder=dinov2_l stage=candor":
        ("dataset.root=data/CUB_200_2011 encoder=random_vit_s", f"{NO_DATA}; {NO_WEIGHTS}"),
    "python -m robustbench_fm -m panel=candor_chest dataset=chexpert launcher=slurm hydra.launcher.partition=gpu":
        ("dry_run=true paths.data_dir=data", f"{SLURM}; {NO_DATA}"),
    "python -m robustbench_fm -m panel=candor_chest dataset=mimic_cxr extract.num_shards=8 'extract.shard=range(8)' "
    "launcher=slurm":
        ("dry_run=true paths.data_dir=data", f"{SLURM}; {NO_DATA}"),
}


#: commands that another test runs as written (plus the output root a test needs), with the
#: assertions about what they write; running them here too would double the suite's longest runs.
DEMO = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . -c constraints.txt && "
        "HF_HUB_OFFLINE=1 python -m robustbench_fm")
RUN_BY: dict[str, str] = {
    "python -m robustbench_fm experiment=spar_demo": "tests/methods/spar/test_spar_demo.py",
    # the demo (and the README's ```text table of what it prints: test_readme_table_is_what_the_demo_prints)
    DEMO: "tests/cli/test_demo.py",
    # the real-encoder demo (its README table: test_the_readme_shows_what_it_prints there)
    "pip install -e '.[real]' -c constraints.txt && HF_HUB_OFFLINE=1 python -m robustbench_fm experiment=real_demo":
        "tests/cli/test_real_demo.py",
}


def _demo_leaves(cwd: Path) -> None:
    """What the demo leaves in the folder that the README's later commands read ("on the demo's
    images (after the demo, in the same folder)"): its 200 planted images and ``labels.csv``, written
    by the generator the demo's dataset card calls on first use (configs/dataset/planted.yaml)."""
    from omegaconf import OmegaConf

    from robustbench_fm.data.synthetic import generate_planted

    card = OmegaConf.load(REPO / "configs" / "dataset" / "planted.yaml")
    generate_planted(cwd / "outputs" / "demo_data" / "planted", **card.options)


#: what a command run elsewhere (RUN_BY) leaves behind for the commands after it
LEAVES = {DEMO: _demo_leaves}


def run_by_args(cmd: str) -> list[str]:
    """The arguments after ``python`` of a command (of a set-up command: of the command after the install)."""
    setup = SETUP.match(cmd)
    words = (setup["cmd"] if setup else cmd).split()
    return words[words.index("python") + 1:]


def _data(data_dir: Path) -> None:
    """Everything the substituted commands read under ``./data``, in the released layouts."""
    _chest_data(data_dir)
    from fixtures_natural import write_cub

    write_cub(data_dir / "CUB_200_2011", per_class=12)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` is this venv's
    env["HF_HUB_OFFLINE"] = "1"
    return env


#: shell syntax that only bash runs as written (pipes, lists, redirections, substitutions, variable
#: assignments before the command): a command holding any runs through ``bash -c``
SHELL_ONLY = re.compile(r"[|&;<>`]|\$\(|^\w+=")


def forked_args(cmd: str, cwd: Path, env: dict) -> list[str] | None:
    """The words after ``python`` of a plain ``python -m robustbench_fm ...`` command, exactly as bash
    splits and expands them (quotes, ``$PWD``, ...), for the suite's fork server
    (tests/fixtures/cli_process.py: a fresh process without the ~7 s of imports); None for any other
    command."""
    if not cmd.startswith("python -m robustbench_fm") or SHELL_ONLY.search(cmd):
        return None
    split = subprocess.run(["bash", "-c", f"printf '%s\\0' {cmd}"], cwd=cwd, env=env, capture_output=True,
                           text=True, check=True)
    argv = split.stdout.split("\0")[:-1]
    return argv[1:] if argv[:3] == ["python", "-m", "robustbench_fm"] else None


def test_pages_are_the_readme_and_every_docs_page():
    docs = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert PAGES[0] == "README.md" and len(set(PAGES)) == len(PAGES)
    assert set(PAGES[1:]) == docs, (sorted(docs - set(PAGES)), sorted(set(PAGES) - docs))


def test_readme_is_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def test_every_block_has_a_language():
    langs = [(page, lang) for page, lang, _ in blocks()]
    assert langs and all(lang in ("bash", "python", "text") for _, lang in langs), langs


def test_no_command_is_shown_twice():
    """Each command runs once: one shown on two pages (or twice on one) would run twice."""
    shown = shown_commands()
    assert len(shown) == len(set(shown)), sorted({c for c in shown if shown.count(c) > 1})


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code spans (links live outside them)."""
    return re.sub(r"`[^`\n]*`", "", BLOCK.sub("", text))


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors of a page: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading suffixed -1, -2, ..."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", BLOCK.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        n = sum(1 for a in out if a == slug or re.fullmatch(re.escape(slug) + r"-\d+", a))
        out.add(f"{slug}-{n}" if n else slug)
    return out


def test_anchors_follow_githubs_rule():
    text = ("# A\n## Images stored at 224 × 224 (`resolution`)\n## Data\n```text\n# not a heading\n```\n"
            "## Data\n")
    assert _anchors(text) == {"a", "images-stored-at-224--224-resolution", "data", "data-1"}


def test_every_relative_link_resolves():
    """Each ``[text](target)`` of the pages names an existing file of the repository and, for a
    page, an existing heading."""
    broken = []
    for page in PAGES:
        here = (REPO / page).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose((REPO / page).read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (here / path).resolve() if path else REPO / page
            if not file.exists():
                broken.append((page, target))
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append((page, target, sorted(_anchors(file.read_text()))))
    assert not broken, broken


def test_readme_shows_exactly_two_setup_commands_and_ci_runs_the_test_one():
    setup = [c for c in shown_commands() if SETUP.match(c)]
    assert len(setup) == 2, setup
    readme = [c for page, lang, body in blocks() if page == "README.md" and lang == "bash" for c in commands(body)]
    assert set(setup) <= set(readme), setup  # both on the README, a newcomer's first screen
    demo, tests = (SETUP.match(c) for c in setup)
    # the exact torch pair comes from constraints.txt; pyproject.toml declares only the range
    assert demo["what"] == "-e . -c constraints.txt" and demo["cmd"] == "HF_HUB_OFFLINE=1 python -m robustbench_fm"
    assert tests["what"] == "-e '.[dev]' -c constraints.txt" and tests["cmd"] == "HF_HUB_OFFLINE=1 python -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -q -e '.[dev]' -c constraints.txt" in ci and "export HF_HUB_OFFLINE=1" in ci
    assert "python -m pytest -q" in ci


def test_torch_is_a_range_in_pyproject_and_an_exact_pair_in_the_constraints():
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_deps = [d for d in deps if d.split(">")[0].split("=")[0].split("<")[0] in ("torch", "torchvision")]
    assert torch_deps == ["torch>=2.14,<3", "torchvision>=0.29,<1"] and not any("==" in d for d in deps)
    pins = [ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert pins == ["torch==2.14.1", "torchvision==0.29.1"]
    from importlib.metadata import version
    assert version("torch").split("+")[0] == "2.14.1" and version("torchvision").split("+")[0] == "0.29.1"


def test_substitutes_name_commands_the_pages_show():
    shown = set(shown_commands())
    assert set(SUBSTITUTES) <= shown, set(SUBSTITUTES) - shown


def test_commands_run_by_another_test_are_shown_and_run_there():
    shown = set(shown_commands())
    for cmd, test in RUN_BY.items():
        assert cmd in shown, cmd
        # that test's subprocess runs the command's arguments as written, in this order
        args = run_by_args(cmd)
        assert ", ".join(f'"{a}"' for a in args) in (REPO / test).read_text(), (cmd, test)


def test_every_command_of_the_readme_and_the_docs_runs_as_written(workspace):
    env = _env()
    ran, forked = [], []
    _run_every_block(workspace, env, ran, forked)
    assert len(ran) >= 20, ran
    assert len(forked) >= 15, forked  # the plain commands skipped the interpreter's start-up


def _run_every_block(workspace: Path, env: dict, ran: list, forked: list) -> None:
    for page, lang, body in blocks():
        if lang == "text":
            continue
        if lang == "python":
            proc = subprocess.run([sys.executable, "-"], input=body, cwd=workspace, env=env, capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, f"{page}: python block failed:\n{body}\n{proc.stderr[-3000:]}"
            ran.append(f"{page}: python block")
            continue
        for cmd in commands(body):
            setup = SETUP.match(cmd)
            if setup and "pytest" in setup["cmd"]:
                continue  # the test command is this suite: .ci/run runs it (test above)
            if cmd in RUN_BY:
                if cmd in LEAVES:
                    LEAVES[cmd](workspace)
                continue  # run as written by RUN_BY[cmd] (test above)
            run = setup["cmd"] if setup else cmd
            extra, _why = SUBSTITUTES.get(cmd, ("", ""))
            if "data" in extra and not (workspace / "data").exists():
                _data(workspace / "data")
            full = f"{run} {extra}".strip()
            argv = forked_args(full, workspace, env)
            if argv is not None:
                proc = cli_process.run(argv, cwd=workspace, env=env, timeout=900)
                forked.append(cmd)
            else:
                proc = subprocess.run(["bash", "-c", full], cwd=workspace, env=env,
                                      capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, (f"{page}: {cmd!r} failed ({proc.returncode}):\n"
                                          f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            ran.append(cmd)
