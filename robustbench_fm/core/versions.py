"""What a run does with stored rows made with other package or library versions
(``cache.on_version_change``; :mod:`robustbench_fm.features.store` records the versions per chunk)."""

#: reuse: use them, with a one-line notice; warn: use them, with a warning; recompute: embed again
VERSION_POLICIES = ("reuse", "warn", "recompute")
