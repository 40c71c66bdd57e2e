"""Reports: a sweep's (or run's) results as the papers' tables, beside the published numbers, and
one report per run or sweep. The builders of each paper's tables and its figures live with the
method (the ``tables`` and ``figures`` its ``Method(...)`` registration names, e.g.
:mod:`robustbench_fm.methods.candor.tables`, :mod:`robustbench_fm.methods.croma.plots`); this
package runs and renders them.

* :mod:`.tables`: the registry of table builders (every registered method's ``TABLES``) and
  :func:`~.tables.build_tables`, which runs an experiment's ``report.tables`` (the builder
  contract, :class:`~robustbench_fm.core.tables.PaperTable` and ``SweepResults``, is in core);
* :mod:`.render`: markdown / LaTeX / CSV in the paper's layout, bold best, underlined second;
* :mod:`.long_format`: every stage summary as (encoder, dataset, task, stage, group, metric, value, CI, n, seed,
  config_hash) rows;
* :mod:`.compare`: ours beside the papers' numbers (:mod:`robustbench_fm.paper.published`):
  ours, published, difference, flagged beyond the published interval;
* :mod:`.html`: ``report.md`` and a self-contained ``report.html`` per run and per sweep (jinja2
  templates in ``templates/``).

The papers' published numbers and the helpers every figure shares are a layer of their own below
the methods, :mod:`robustbench_fm.paper`, which the methods and this package both read.
"""
