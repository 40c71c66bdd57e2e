"""The command line: ``python -m robustbench_fm`` (the Hydra app and the subcommands its argparse
parser declares, :func:`.main.parser`), the job runner (:mod:`.app`), sweeps and the Hydra
callbacks. The top layer: imports everything, imported by nothing but ``__main__``. The configs'
resolvers and generated options are the pipeline's (:mod:`robustbench_fm.pipeline.configstore`),
registered by :func:`.main.main` before Hydra composes."""
