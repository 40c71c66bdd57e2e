"""The pipeline below the command line (docs/architecture.md, "One run"): what a job does
(:mod:`.job`), how a finished sweep's or experiment's jobs are merged into its tables and report
(:mod:`.collect`), and an experiment run as one unit, its jobs one after another in this process
(:mod:`.experiment`). The command line (:mod:`robustbench_fm.cli`) parses, prints and fans jobs out
onto a launcher; ``robustbench_fm.run`` is the Python face (:mod:`robustbench_fm.api`).

Imports no torch until a job runs; of Hydra only its compose API (:mod:`.experiment`: the
experiments are Hydra config files, and their job list is the basic sweeper's expansion)."""
