"""What opttree knows of transformers' objects: the one place their internals are touched.

* :mod:`.kv_cache`: the cache: keep a step's accepted slots, the rows' holes, compaction;
* :mod:`.compat`: names that moved between transformers versions (the cache's);
* :mod:`.validation`: a model's vocabulary, context and attention; checks of a generate() call;
* :mod:`.compiled`: the verification forward through generate()'s own compiled callable, where
  generate() would compile plain decoding (one graph per fixed verification size).

The ground floor beside :mod:`opttree.tree`: imports nothing else of opttree; every folder above may import it.
"""
