"""What opttree knows of transformers' objects: the one place their internals are touched.

* :mod:`.kv_cache`: the cache: keep a step's accepted slots, the rows' holes, compaction;
* :mod:`.compat`: names that moved between transformers versions (the cache's);
* :mod:`.validation`: a model's vocabulary, context and attention; checks of a generate() call;
* :mod:`.linears`: few-row float32/bfloat16 linears on the CPU through the kernel measured fastest per shape,
  scoped to the call's models.

The ground floor beside :mod:`opttree.tree`: imports nothing else of opttree; every folder above may import it.
"""
