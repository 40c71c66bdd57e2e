"""What the numbers of SPAR-Bench mean, for a report's "How to read this" (``Method(guide=...)``
names the text here). spar.md §3 (probes, chance, the zero-shot cohort).
"""

SPAR = """
accuracy is the share of correct answers of a probe head, chance is 1 / the number of classes (column chance);
a probe that falls to chance on the zero-shot cohort (eval_dataset other than the training data) was answered
from the usual layout of anatomy rather than from the image; the majority class rate (column majority) is the
bar where labels are imbalanced. Distance can be answered well above 0.5 from which organ pairs are asked alone
(their usual spacing): the question-only prior (column prior, the dash-dotted line) is what that lookup of the
training labels scores, and a head that reads distance from the image must beat it. The Canonical recall row
(columns ref_med, ref_med_native, ref_perm_acc, canonical) is what recalling the usual anatomy gives, from the
training data only: MED of predicting each organ's mean training position, Perm of putting each organ in its
usual training cell, and Level 3 answers from the question plus how the slice is shown (relative position:
the organ pair and whether the slice is flipped; blank on orientation, where the presentation is the answer).
An encoder row at or below it has shown no knowledge of this patient's anatomy. spar_oracle (Oracle-*
rows) is a planted reference whose tokens are computed from the organ masks: near 1 means the samples, heads
and scoring can learn, so a real encoder near chance lacks the information, not the pipeline.
"""
