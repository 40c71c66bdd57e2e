"""``experiment=spar_demo`` with and without ``-m`` writes the same SPAR tables, byte for byte: without
``-m`` the experiment runs here as one command (its one job builds the tables at the end of its
run); with ``-m`` the sweep's collect step builds them. Shrunk to one small backbone, few phantoms
and one epoch so that the pair of runs stays short; both train with the same seed."""
import cli_process
import pytest

pytestmark = pytest.mark.slow  # two SPAR runs (token extraction and head training on the CPU)

SMALL = ["experiment=spar_demo", "encoders=[random_vit_s]", "dataset.options.n_subjects=6",
         "dataset.options.extra_test=0",
         "dataset.options.n_lits=2", "dataset.options.distance_questions=2",
         "stage.params.transfer.totalsegmentator.options.n_subjects=4",
         "stage.params.transfer.totalsegmentator.options.distance_questions=2",
         "stage.params.transfer.totalsegmentator.options.extra_test=0",
         "stage.params.max_epochs=1", "stage.params.by_encoder.spar_oracle.max_epochs=1",
         "stage.params.by_encoder.spar_canonical.max_epochs=1", "device=cpu",
         "extract.num_workers=0"]


def _tables(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "tables").iterdir())}


def test_spar_demo_with_and_without_m_writes_the_same_tables(tmp_path):
    common = ["-m", "robustbench_fm", f"paths.root={tmp_path}"]
    sweep = cli_process.run([*common[:2], "-m", *common[2:], *SMALL, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            cwd=tmp_path, timeout=900)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    unit = cli_process.run([*common, *SMALL, f"hydra.run.dir={tmp_path / 'unit'}"], cwd=tmp_path, timeout=900)
    assert unit.returncode == 0, unit.stdout[-3000:] + unit.stderr[-3000:]
    tables = _tables(tmp_path / "sweep")
    assert {f"spar_table{n}.csv" for n in range(1, 6)} <= set(tables)
    assert _tables(tmp_path / "unit") == tables
