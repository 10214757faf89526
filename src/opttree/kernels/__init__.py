"""opttree's own CPU kernels, and what this CPU can run.

* :mod:`.cpu`: ``cpu_support()``, the kernels this CPU and torch build can run, asked of torch and oneDNN;
* :mod:`.linears`: few-row float32/bfloat16 linears on the CPU through the kernel measured fastest per
  shape and row count, scoped to the call's models;
* :mod:`.choice`: how that kernel is chosen: timed in two rounds (the second after warm-up), stock
  always a candidate.

May import: nothing else of opttree (a ground floor; every runtime folder may import it).
"""
