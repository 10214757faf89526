"""What opttree knows of transformers' objects: the one place their internals are touched.

* :mod:`.kv_cache`: the cache: keep a step's accepted slots, the rows' holes, compaction;
* :mod:`.compat`: names that moved between transformers versions (the cache's), and a draft head's
  scaled RoPE as transformers computes it;
* :mod:`.generate_call`: the one seam no argument covers: what generate() was called with but keeps from a
  ``custom_generate`` callable (read from its frame for ``custom_generate=speculative_generate``);
* :mod:`.validation`: a model's context and attention; checks of a generate() call;
* :mod:`.tree_cache`: the cache contract (which caches a call may use, refused by name with a fix),
  and the target's cache opened for trees and closed back as plain leaves it;
* :mod:`.compiled`: THE verification forward (``target_forward``: decoding runs it, calibration times
  it on ``ScratchTarget``, the target on a cache of its own), through generate()'s own compiled callable
  where generate() would compile plain decoding (one graph per fixed verification size);
* :mod:`.width`: a model's widths: its logits' (the vocabulary), and the width its config says carries
  its function (a field any target may carry), with the embedding and output rows at it.

May import: nothing else of opttree (the ground floor beside :mod:`opttree.tree`; every folder above may
import it).
"""
