"""opttree as a transformers ``custom_generate`` method: lossless speculative decoding with
adaptive draft trees (OPT-Tree).

    model.generate(**inputs, custom_generate="<this repo or folder>", trust_remote_code=True,
                   draft_model=draft, nodes=60, threshold=0.5)

generate() hands this function the model and every argument it was given; opttree (installed
from requirements.txt) runs the tree loop inside stock generate().
"""

from opttree.integration import hub_generate


def generate(model, **kwargs):
    """``draft_model=``: a small causal LM sharing the target's vocabulary, a draft folder written by
    ``opttree distill``, or ``"prompt_lookup"``. Optional: ``nodes`` (tree budget, or ``"auto"``),
    ``threshold``, ``max_depth``, ``strategy``, ``verifier``, ``static_tree``, ``generator``.
    Everything else is generate()'s own."""
    return hub_generate(model, **kwargs)
