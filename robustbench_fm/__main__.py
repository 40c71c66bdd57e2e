"""``python -m robustbench_fm``: the command line (:mod:`robustbench_fm.cli.main`)."""
from robustbench_fm.cli.main import main

if __name__ == "__main__":
    main()
