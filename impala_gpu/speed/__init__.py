"""The fast paths, each one switch and one module by its role:

- ``precision``: bf16 autocast of the forward passes (``precision=``);
- ``compile``: ``torch.compile`` of the model (``compile=``);
- ``threads``: the learner's torch threads (``learner_threads=``), the one rule for the run,
  its ranks and ``auto``'s timings;
- ``tcmalloc``: the CLI's restart with tcmalloc preloaded (``IMPALA_GPU_TCMALLOC``).

Each is measured in ``benchmarks/`` and tested against the plain path in ``tests/speed/``. None
changes what is computed beyond bf16 rounding.
"""
