"""SPAR-Bench (spar.md): spatial anatomical reasoning probes over multi-organ abdominal CT.

Samples: ``samples`` (slice selection, organ tiles, cached sample tables) and ``probes`` (probe
labels), over the CT volumes of :mod:`robustbench_fm.data.ct` (NIfTI in RAS, the WORD / LiTS /
TotalSegmentator layouts, phantoms).
"""
