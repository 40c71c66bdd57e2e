"""Chest X-ray adapters (catalog 1.1): one module per source, registered on import.

Every adapter maps its labels to CANDOR's 12 harmonised findings through ``chest_findings.csv``
and sets ``acq_group = site_view`` (common.py).
"""
from . import chexpert, mimic, nih, openi, padchest, rsna, vindr  # noqa: F401  (register the adapters)
