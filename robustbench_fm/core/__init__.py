"""The base layer every other layer builds on: errors, the lazy registry, devices, atomic writes,
redaction, results, text (one-line messages), locking, the one exact kNN engine and the
statistics (bootstrap, intervals, BH, MH, Spearman). Imports nothing above it (no data,
encoders, features, methods, report, cli or Hydra)."""
