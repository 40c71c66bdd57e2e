"""Reports: paper-layout tables and plots of stage results, beside the published numbers.

* :mod:`.tables` (the builder contract, :class:`~.tables.PaperTable`), ``tables_<paper>`` (builders);
* :mod:`.render`: markdown / LaTeX / CSV in the paper's layout, bold best, underlined second;
* :mod:`.long_format`: every stage summary as (encoder, dataset, task, stage, group, metric, value, CI, n, seed,
  config_hash) rows;
* :mod:`.published` (the papers' numbers, package data in ``published/``) and :mod:`.compare`
  (ours, published, difference, flagged beyond the published interval);
* :mod:`.candor_plots`, :mod:`.croma_plots`, :mod:`.spar_plots`: the papers' figures (PNG + PDF);
* :mod:`.html`: ``report.md`` and a self-contained ``report.html`` per run and per sweep.
"""
