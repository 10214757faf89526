"""Tools apart from decoding: nothing on the decoding path imports them.

* :mod:`.viz`: pictures of a step's tree and of a run's statistics (matplotlib);
* :mod:`.overhead`: counts of a step's aten ops, kernel launches and host reads outside the forwards;
* :mod:`.ties`: greedy equality up to rounding, in every dtype: equal, a near-tie of plain's own scores, or a
  mismatch.

May import: :mod:`opttree.loop` (its stats), :mod:`opttree.tree`. Used by ``opttree bench``, the benchmarks, the
tests and the notebook.
"""
