"""Abdominal CT datasets of SPAR-Bench (spar.md section 3; catalog 1.7): one manifest row per volume.

Modules: :mod:`.volumes` (NIfTI read in RAS, windows), :mod:`.layouts` (the WORD / LiTS /
TotalSegmentator on-disk layouts, organ label maps, the datasets' options) and :mod:`.phantoms`
(synthetic volumes in those layouts).

The volumes themselves are read by ``robustbench_fm.methods.spar.samples.build_samples``; the manifest
lists them (``sample_id`` = subject, ``path`` = the CT file, ``split``) so that the datasets
plan and compose like the others. ``spar_phantom_word`` (and ``spar_phantom_totalsegmentator``)
are synthetic phantoms in the real layouts, written on first use by ``generate``.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..registry import Adapter, register
from .layouts import DATASET_LAYOUTS, list_volumes, sample_options
from .phantoms import write_phantoms

PHANTOM_DEFAULTS = {"n_subjects": 30, "n_lits": 20, "phantom_seed": 0, "extra_test": 0}


def _manifest(dataset: str, root: str | Path, **options) -> pd.DataFrame:
    """One row per labelled volume of ``dataset`` under ``root`` (options are checked, see ``sample_options``)."""
    sample_options(dataset, options)
    root = Path(root)
    vols = list_volumes(DATASET_LAYOUTS[dataset], root)
    return pd.DataFrame({
        "sample_id": [v.subject_id for v in vols],
        "path": [v.image.relative_to(root).as_posix() for v in vols],
        "patient_id": [v.subject_id for v in vols],
        "site": [v.dataset for v in vols],
        "split": [v.split for v in vols],
    })


def _phantom_generator(layout: str):
    def generate(root: str | Path, **options) -> Path:
        """Write the phantom set (and, for WORD, its LiTS-style set under ``root/lits``)."""
        opts = {**PHANTOM_DEFAULTS, **{k: v for k, v in options.items() if k in PHANTOM_DEFAULTS}}
        root = Path(root)
        write_phantoms(root, layout, n_subjects=int(opts["n_subjects"]), seed=int(opts["phantom_seed"]),
                       extra_test=int(opts["extra_test"]))
        if layout == "word" and int(opts["n_lits"]) > 0:
            write_phantoms(root / "lits", "lits", n_subjects=int(opts["n_lits"]), seed=int(opts["phantom_seed"]) + 1)
        return root
    return generate


def _adapter(name: str, description: str, **kwargs) -> Adapter:
    return register(Adapter(name=name, build=lambda root, **options: _manifest(name, root, **options),
                            description=description, **kwargs))


WORD = _adapter(
    "word", "WORD: 150 abdominal CT volumes with 16 organ label maps (imagesTr/Val/Ts, 100/20/30).")
LITS = _adapter(
    "lits", "LiTS: liver CT volumes with liver (1) and tumour (2) labels; SPAR counts tumours on 20 of them.")
TOTALSEG = _adapter(
    "totalsegmentator", "TotalSegmentator: CT subjects with one binary mask per class; meta.csv split.")
PHANTOM_WORD = _adapter(
    "spar_phantom_word", "Synthetic abdominal CT phantoms in the WORD layout, LiTS-style set under lits/.",
    generate=_phantom_generator("word"))
PHANTOM_TOTALSEG = _adapter(
    "spar_phantom_totalsegmentator", "Synthetic abdominal CT phantoms in the TotalSegmentator layout.",
    generate=_phantom_generator("totalsegmentator"))
