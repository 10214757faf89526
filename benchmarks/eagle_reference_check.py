"""The checked bar of issue 49, run against the EAGLE authors' own code: a random EAGLE-3 head for a tiny
Llama target (tests/eagle_folders.py), drafted by SafeAILab/EAGLE's ``eagle/model/cnets.py``
``Model.topK_genrate`` (its log-probabilities recorded) and by opttree
(``speculative(target).generate(..., draft_model=<folder>, nodes=10, threshold=0.0)``, the tree in
``out.stats.steps[0].tree``): the depth-1 nodes and their p̂, and the depth-2 nodes under the best
one, must equal the reference's top tokens and probabilities within 1e-4 (float32), and the output
plain greedy's. opttree ships none of EAGLE's code: pass a checkout of it.

    python benchmarks/eagle_reference_check.py --eagle-repo PATH/TO/EAGLE   # prints the largest |p̂ - ref|

The reference was written for an older transformers: its config's ``rope_scaling`` is set back to
None and ``rope_theta`` taken from the head's config.json, as that transformers left them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def reference_probs(eagle_repo: Path, folder: Path, target, ids: torch.Tensor) -> tuple[dict, dict]:
    """{target id: q} of the reference's top 10 at depth 1, and {target id: p̂} under its best."""
    sys.path.insert(0, str(eagle_repo))
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig
    from safetensors.torch import load_file

    config = EConfig.from_pretrained(str(folder))
    config.rope_scaling = None
    config.rope_theta = json.loads((folder / "config.json").read_text())["rope_theta"]
    model = Model(config, total_tokens=11, depth=2, top_k=10)
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    model.embed_tokens.weight.data = target.get_input_embeddings().weight.detach().clone()
    model.eval().init_tree()
    recorded = []

    class Record(torch.nn.Module):
        def forward(self, x):
            recorded.append(torch.log_softmax(x, -1))
            return recorded[-1]

    model.logsoftmax = Record()
    layers = target.config.num_hidden_layers
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states
        model.topK_genrate(torch.cat([states[2], states[layers // 2], states[layers - 3]], -1), ids, None, None)
    d2t = model.d2t
    top1 = recorded[0][0].exp().topk(10)
    depth1 = {int(i + d2t[i]): float(p) for i, p in zip(top1.indices, top1.values)}
    top2 = recorded[1][0].exp().topk(10)  # the depth-1 nodes are fed in top order: row 0 is the best
    depth2 = {int(i + d2t[i]): float(p) * float(top1.values[0]) for i, p in zip(top2.indices, top2.values)}
    return depth1, depth2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eagle-repo", type=Path, required=True, help="a checkout of SafeAILab/EAGLE")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    import opttree
    from eagle_folders import target_for, write_eagle3

    target = target_for("llama")
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_eagle3(Path(tmp) / "head", target, seed=args.seed)
        depth1, depth2 = reference_probs(args.eagle_repo, folder, target, ids)
        opttree.load_draft(folder, target)
        out = opttree.speculative(target).generate(ids, max_new_tokens=12, do_sample=False, draft_model=str(folder),
                                                   nodes=10, threshold=0.0, return_dict_in_generate=True)
    tree = out.stats.steps[0].tree
    greedy = torch.equal(out.sequences, target.generate(ids, max_new_tokens=12, do_sample=False))
    first = (tree.parents == -1).nonzero().flatten().tolist()
    under = (tree.parents == first[0]).nonzero().flatten().tolist()
    tokens1, tokens2 = [int(tree.tokens[n]) for n in first], [int(tree.tokens[n]) for n in under]
    same = tokens1 == list(depth1)[:len(first)] and tokens2 == list(depth2)[:len(under)]
    worst = max([abs(depth1[t] - float(tree.path_probs[n])) for t, n in zip(tokens1, first)]
                + [abs(depth2[t] - float(tree.path_probs[n])) for t, n in zip(tokens2, under)])
    print(f"depth-1 {tokens1} (reference {list(depth1)[:len(first)]}), depth-2 under the best {tokens2} "
          f"(reference {list(depth2)[:len(under)]}); largest |p̂ - ref| {worst:.2e}; greedy equal: {greedy}")
    return 0 if same and worst <= 1e-4 and greedy else 1


if __name__ == "__main__":
    sys.exit(main())
