"""Trained heads on frozen features and what is measured with them (candor.md "Implementation",
"Baselines", "Discordance and Head Errors", Table 4; candor_v1.md "Implementation", Table 4).

* :mod:`.params`: the parameters of every stage here, one typed structure each with the paper's
  defaults (a parameter shared with CANDOR or the heads is declared once);
* :mod:`.rows`: the stable-hash draw of the ≤ 25,000 training / ≤ 20,000 test rows shared by
  every encoder, and the split carve-out for datasets without one;
* :mod:`.train`: linear and 256-unit MLP heads (Adam, 30 epochs, lr 1e-3, wd 1e-4, batch 256);
* :mod:`.operating_point`: the threshold at 0.800 validation sensitivity;
* :mod:`.fit`: one finding end to end (draw → train → threshold → scores);
* :mod:`.failure`: failure-detection scores (confidence, ensemble, Mahalanobis, k-NN, DM proxy);
* :mod:`.combine`: rules that combine a panel's heads (Table 4);
* :mod:`.logme`: LogME evidence (You et al. 2021);
* :mod:`.guide`: what each stage's numbers mean (a report's "How to read this").

Their statistics live in :mod:`robustbench_fm.core.stats`: the patient-clustered bootstrap of
AUROCs (paired across scores) with its percentile interval and p-value, BH, and the
Mantel-Haenszel risk difference of miss rates with Sato's variance.
"""
from .. import Method, Paired, Pairing, register
from .params import CandorHeadsParams, ErrorDetectionParams, HeadParams, LogmeParams, MlpHeadParams

_HEAD_COLUMNS = ("encoder", "finding", "auroc", "auroc_ci_low", "auroc_ci_high", "threshold", "test_sensitivity",
                 "test_specificity", "n")
_AUROC = (("auroc", "higher"),)
#: the test rows are the same images for every encoder (a stable hash of sample_id: ``rows``), so heads'
#: AUROCs are compared paired, resampling patients
#: why a head's AUROC is not compared between encoders (docs/comparisons.md "What is compared")
HEAD_NOT_COMPARED = ("each encoder's test scores come from a head trained once on the training rows, which the "
                     "patient bootstrap of the test rows holds fixed: under a null of equal encoders p < 0.05 came "
                     "out in 0.08 of pairs, so no verdict rests on it (docs/comparisons.md)")
_HEAD_PAIRING = Pairing(metrics=(Paired("auroc", "auroc", "logit", "label", where="split=test", better="higher",
                                        not_compared=HEAD_NOT_COMPARED),), rows=("finding",))
register(Method("linear_head", "a linear head per finding: AUROC, operating point at 0.8 sensitivity",
                f"{__name__}.stage", display_name="linear heads", headline=_AUROC, guide=f"{__name__}.guide:HEADS",
                console_columns=_HEAD_COLUMNS, tables=f"{__name__}.tables", params=HeadParams,
                pairing=_HEAD_PAIRING))
register(Method("mlp_head", "a 256-unit MLP head per finding: AUROC, operating point at 0.8 sensitivity",
                f"{__name__}.stage", display_name="MLP heads", headline=_AUROC, guide=f"{__name__}.guide:HEADS",
                console_columns=_HEAD_COLUMNS, tables=f"{__name__}.tables", params=MlpHeadParams,
                pairing=_HEAD_PAIRING))
register(Method("logme", "LogME transferability score per finding", f"{__name__}.logme_stage",
                display_name="LogME", headline=(("logme", "higher"),), guide=f"{__name__}.guide:LOGME",
                console_columns=("encoder", "finding", "logme", "n"), params=LogmeParams))
register(Method("error_detection", "failure detection: MSP, energy, kNN, Mahalanobis, impurity r, DM proxy",
                f"{__name__}.error_detection", display_name="error detection", headline=_AUROC,
                guide=f"{__name__}.guide:ERROR_DETECTION", group_columns=("stratum", "method"),
                console_columns=("encoder", "finding", "stratum", "method", "auroc", "diff_vs_msp", "q_value", "n",
                                 "n_errors"),
                tables=f"{__name__}.tables", params=ErrorDetectionParams,
                # each detector's AUROC for the head's errors, on the same test rows for every encoder
                pairing=Pairing(metrics=(Paired("auroc", "auroc", "score", "error", better="higher",
                                                not_compared=HEAD_NOT_COMPARED),),
                                rows=("finding", "stratum", "method"), table="items")))
register(Method("candor_heads", "head errors joined with CANDOR discordance per sample (Table 4)",
                f"{__name__}.candor_heads", display_name="CANDOR and head errors",
                headline=(("auroc", "higher"), ("d", "lower"), ("miss_discordant", "lower"), ("miss_other", "lower")),
                guide=f"{__name__}.guide:CANDOR_HEADS", multi_finding=True,
                console_columns=("encoder", "finding", "auroc", "d", "miss_discordant", "miss_other", "fpr_near",
                                 "fpr_far", "n"),
                tables=f"{__name__}.tables", params=CandorHeadsParams))
