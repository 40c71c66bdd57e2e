"""What the numbers of the head stages mean, for a report's "How to read this" (each stage's
``Method(guide=...)`` names its text here). candor.md "Implementation", "Baselines",
"Discordance and Head Errors".
"""

HEADS = """
auroc is the test AUROC of a head trained on the frozen features (chance 0.5, higher is better), with the 95%
interval of bootstrap resamples clustered by patient; the threshold is the operating point with 0.8 sensitivity
on the validation split.
"""

CANDOR_HEADS = """
miss_discordant and miss_other are the shares of discordant positives (D's flag) and of the other positives that
the trained head misses at its operating point; fpr_near and fpr_far the false-positive rates of the negatives
nearer to the positives and of the others.
"""

ERROR_DETECTION = """
auroc measures how well a score ranks the head's errors above its correct predictions (chance 0.5); diff_vs_msp
is its difference from the maximum softmax probability, q_value BH-corrected.
"""

LOGME = """
logme is the log evidence of a linear model on the frozen features (higher is better); it has no fixed chance
level.
"""
