"""The decoding loop: one function in numbered steps, for one prompt or a batch of rows.

* :mod:`.generation`: ``speculative_decode``, its steps numbered: 0 prefill, then 1 draft, 2 verify,
  3 walk, 4 caches, 5 commit, 6 finished rows leave;
* :mod:`.settings`: ``DecodeSettings``, what one decode runs with;
* :mod:`.drafting`: step 1, every row's tree, its drafter calls timed per row (``Drafted``);
  :mod:`.verify_inputs`: step 2's inputs; :mod:`.walking`: step 3, each row's walk;
  :mod:`.slots`: the rows' cache slots and step 4's keep of them; :mod:`.committing`: step 5
  (commit, stopping, figures);
* :mod:`.rows`: each prompt while it is decoded, and a prompt batch's padding;
* :mod:`.outputs`: generate()'s outputs for the rows of a finished decode;
* :mod:`.lockstep`: the rows' tree builders side by side, one drafter call per round;
* :mod:`.stopping`: where generate()'s stopping criteria stop inside a step's tokens;
* :mod:`.batch_context`: generate()'s logits processors on one row of a batch, at its batch index;
* :mod:`.model_inputs`: ``inputs_embeds`` and ``token_type_ids`` for each forward's stretch of tokens;
* :mod:`.stats`: what a call did, step by step.

May import: :mod:`opttree.drafters`, :mod:`opttree.verify`, :mod:`opttree.tree`, :mod:`opttree.hf`,
:mod:`opttree.kernels`.
Imported by the face (:mod:`opttree.integration`); its stats also by the tools and ``opttree bench``.
"""
