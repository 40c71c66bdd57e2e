"""The confounder scan (issue 55 items 3-4): what else each encoder's neighbourhoods are organised by.

* :mod:`.params`: the stage's parameters, one typed structure (the one home of its defaults);
* :mod:`.stage`: the kNN graph (once per encoder), each column's share of same-value neighbours against its
  exact chance level, the balanced score with its patient-clustered interval, and CRoMa's RI from a scan;
* :mod:`.section`: the report's "What the neighbourhoods follow" (a sentence per encoder, the scan table);
* :mod:`.guide`: what the numbers mean (a report's "How to read this"); docs/methods/confounders.md.
"""
from .. import Method, Paired, Pairing, register
from .params import ConfounderParams

#: why the score is not compared between encoders (docs/comparisons.md "What is compared")
KNN_NOT_COMPARED = ("each image's share of same-value neighbours comes from a kNN graph over the other images, which "
                    "the patient bootstrap holds fixed (as RI's counts: on random columns the 95% interval covered 0 "
                    "in 0.79-0.94 of 200 draws), and whether higher is better depends on the column (a finding: yes; "
                    "a site or scanner: no), so no verdict rests on it")

register(Method(
    "confounders", "Confounder scan: how strongly each manifest column (site, scanner, view, sex, findings ...) "
    "organises the kNN graph", f"{__name__}.stage", display_name="Confounder scan",
    # higher: the neighbourhoods follow the column more (wanted for a finding, a confounder for a site)
    headline=(("score", "higher"),), guide=f"{__name__}.guide:SCAN", param_columns=("k",),
    integer_columns=("n_values", "n_clusters", "k"), multi_finding=True, findings_optional=True,
    console_columns=("encoder", "column", "kind", "n_values", "n", "observed", "chance", "score", "score_ci_low",
                     "score_ci_high"),
    params=ConfounderParams, report_section=f"{__name__}.section:scan_section",
    # the queries are the same images for every encoder: the score is Σ excess / Σ headroom of the per-item table
    pairing=Pairing(metrics=(Paired("score", "ratio", "excess", "headroom", better="higher",
                                    not_compared=KNN_NOT_COMPARED),), rows=("finding",))))
