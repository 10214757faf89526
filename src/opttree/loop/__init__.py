"""The decoding loop: one function in numbered steps, for one prompt or a batch of rows.

* :mod:`.generation`: ``speculative_decode``: draft, verify, walk, caches, commit, observe;
* :mod:`.rows`: each row's tokens, cache slots, stopping and generate()'s outputs;
* :mod:`.lockstep`: the rows' tree builders side by side, one drafter call per round;
* :mod:`.clock`: the drafter's calls timed per row;
* :mod:`.stopping`: where generate()'s stopping criteria stop inside a step's tokens;
* :mod:`.batch_context`: generate()'s logits processors on one row of a batch, at its batch index;
* :mod:`.model_inputs`: ``inputs_embeds`` and ``token_type_ids`` for each forward's stretch of tokens;
* :mod:`.stats`: what a call did, step by step.

May import: :mod:`opttree.tree`, :mod:`opttree.verify`, :mod:`opttree.drafters`, :mod:`opttree.hf`.
Imported by the face (:mod:`opttree.integration`); its stats also by the tools and ``opttree bench``.
"""
