"""The command line: ``python -m robustbench_fm`` (Hydra app and the ``list``, ``doctor``,
``verify``, ``collect``, ``compare`` subcommands), the job runner (:mod:`.app`), sweeps and the
Hydra resolvers and callbacks. The top layer: imports everything, imported by nothing but
``__main__``."""
