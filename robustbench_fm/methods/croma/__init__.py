"""CRoMa (croma.md): the centre-robustness metric, RI and MaRI, and PathoROB's shortcut probe."""
