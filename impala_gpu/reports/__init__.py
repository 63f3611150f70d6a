"""Reports over finished runs: the figures and tables of ``docs/results/``, each a module run as
``python -m impala_gpu.reports.<name> --help``. They read run dirs (live ones or the archive in
``results/``) through ``impala_gpu.analysis`` and write PNG and Markdown; none changes a run.

- ``plot_learning``: learning curves and the network's health against frames and wall-clock
  (also the console script ``impala-gpu-plot``);
- ``run_summary``: one table row per run, and the frames and time to each threshold (also
  ``impala-gpu-summary``);
- ``compare``: IMPALA against A2C and A3C, table and figure;
- ``lag_study``: the lag study's table, conclusion and figure;
- ``atari5``: the Atari-5 table, estimate and figure;
- ``checkpoint_health``: network health of saved checkpoints on real frames;
- ``optimizer_state``: what the optimizer's second moments say about a checkpoint.

The figures need matplotlib and pandas: ``pip install 'impala_gpu[reports]'``.
"""
