"""What the methods and the reports both read about the papers, as a leaf layer (docs/architecture.md,
"Layers and the one-direction rule"): above ``features``, below ``methods``, importing nothing of
ours but :mod:`robustbench_fm.core` (tests/test_layers.py).

* :mod:`.published`: the papers' published numbers and model labels, package data in ``published/``
  (read by the methods' table builders and by :mod:`robustbench_fm.report.compare`);
* :mod:`.figures`: what every paper's figures share (the columns a figure needs, a figure written
  as PNG and PDF), used by the methods' ``plots`` modules and the reports' heat maps.
"""
