"""SPAR-Bench (spar.md): spatial anatomical reasoning probes over multi-organ abdominal CT.

Parameters: ``params`` (one typed structure with the paper's defaults). Samples: ``samples``
(slice selection, organ tiles, cached sample tables) and ``probes`` (probe
labels), over the CT volumes of :mod:`robustbench_fm.data.ct` (NIfTI in RAS, the WORD / LiTS /
TotalSegmentator layouts, phantoms). What the numbers mean (a report's "How to read this"):
``guide``.
"""
from .. import Method, Paired, Pairing, register
from .params import FINDINGS, SparParams

register(Method("spar", "SPAR-Bench spatial probes (Levels 1-3) on token sequences, frozen or finetuned",
                f"{__name__}.stage", display_name="SPAR-Bench", headline=(("accuracy", "higher"),),
                guide=f"{__name__}.guide:SPAR",
                group_columns=("label", "section", "head", "mode", "eval_dataset", "organ", "seed"),
                param_columns=("epochs", "lr", "chance", "majority", "prior"), tables=f"{__name__}.tables",
                figures=f"{__name__}.plots:report_figures", tables_after_run=True, params=SparParams,
                findings=FINDINGS,
                # the test questions and tile sets are the same for every encoder: each probe's accuracy,
                # Level 1's MED and Level 2's patch accuracy compared paired, resampling volumes (subjects)
                pairing=Pairing(metrics=(Paired("accuracy", "mean", "accuracy", better="higher"),
                                         Paired("med", "mean", "med", better="lower"),  # a distance in px
                                         Paired("patch_acc", "mean", "patch_acc", better="higher")), item="item",
                                unit="volumes",
                                rows=("finding", "head", "mode", "eval_dataset", "seed", "organ"), table="items")))
