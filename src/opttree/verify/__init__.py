"""Verification: which drafted tokens the target keeps, from its one forward over the tree.

* :mod:`.walk`: the walk from the root, the target's own token at each node (``verifier="match"``;
  greedy without processors: every node at once, one host read), and the dispatch to the others;
* :mod:`.sampling`: the exact sampling verifiers ``"rrs"`` and ``"traversal"``, and the draft's q
  under generate()'s warpers;
* :mod:`.acceptance`: ``Acceptance``, what one step's walk accepted.

May import: :mod:`opttree.tree`. Imported by the loop (and by the face, for the draft's warped q).
"""
