"""opttree against RedHat's `speculators` (run by scripts/interop.sh in its own venv).

For tiny random EAGLE-3 heads of each layout (`midlayer.*` and `layers.0.*` keys, norm_before_residual
false and true), written by tests/eagle_folders.py:
- speculators' `Eagle3Converter` converts the folder into its layout;
- speculators' `Eagle3DraftModel` (eager attention) and opttree draft q at depths 1 and 2 from the same
  target hidden states: max |dq| must be <= 1e-5;
- the converter's folder loads back into opttree with bit-identical q.
Negative control: a folder converted with norm_before_residual flipped must move speculators' q by > 1e-3.
Exit status 1 when any check fails."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import opttree
from eagle_folders import target_for, write_eagle3
from opttree.tree import DraftTree
from speculators.convert.eagle.eagle3_converter import Eagle3Converter
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

TOLERANCE = 1e-5
CASES = [("midlayer.", False), ("midlayer.", True), ("layers.0.", False), ("layers.0.", True)]


def prompt(seed: int, length: int = 9) -> torch.Tensor:
    return torch.randint(3, 90, (1, length), generator=torch.Generator().manual_seed(seed))  # [1, n + 1]


def opttree_q(head, target, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """opttree's q [V] for the children of the prompt's last token, and for the children of its best one."""
    drafter = head.for_target(target)
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states
    drafter.add_features(drafter.features_from(states))
    q1 = drafter.root_probs(ids[0])  # [V]
    pool = DraftTree(torch.tensor([int(q1.argmax())]), torch.tensor([-1]), torch.ones(1))
    return q1, drafter.expand(pool, torch.tensor([0]))[0]  # [V], [V]


def load_speculators(folder: Path) -> Eagle3DraftModel:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001 (its flex path needs a GPU)
    model = Eagle3DraftModel.from_pretrained(folder, config=config).eval()
    # The converted folder has no embed_tokens: speculators reads the verifier's. Its NaN marker for "not
    # loaded" does not survive transformers' from_pretrained (the missing weight comes back initialised), so
    # ask for the overwrite that its own loader offers.
    model._load_verifier_weights(overwrite_embed_tokens=True)  # noqa: SLF001
    return model


def speculators_q(model: Eagle3DraftModel, target, ids: torch.Tensor, best: int) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' q [V] at depths 1 and 2 from its training-time forward (ttt_steps=2): entry j pairs the
    taps of token j with token j + 1; step 2 at the last prompt entry reads the token after it (teacher
    forcing), so the sequence is the prompt then `best`, with a zero feature row that no earlier entry sees."""
    taps = model.target_layer_ids
    with torch.no_grad():
        states = target(ids[:, :-1], output_hidden_states=True).hidden_states
        feats = torch.cat([states[i] for i in taps], -1)  # [1, n, 3H]
        feats = torch.cat([feats, feats.new_zeros(1, 1, feats.shape[-1])], 1)  # [1, n + 1, 3H]
        tokens = torch.cat([ids[:, 1:], torch.tensor([[best]])], 1)  # [1, n + 1]
        logits = []
        hook = model.lm_head.register_forward_hook(lambda m, a, out: logits.append(out[0]))
        model(hidden_states=feats, input_ids=tokens, document_ids=torch.zeros_like(tokens), ttt_steps=2)
        hook.remove()
    n = ids.shape[1] - 1
    columns = torch.arange(model.lm_head.out_features) + model.d2t  # [Vd] target ids
    out = []
    for step in logits:  # [n + 1, Vd] per step
        q = torch.zeros(target.config.vocab_size)
        q[columns] = step[n - 1].float().softmax(-1)
        out.append(q)
    return out[0], out[1]


def max_dq(ours, theirs, target) -> float:
    worst = 0.0
    for seed in range(3):
        ids = prompt(seed)
        q1, q2 = opttree_q(ours, target, ids)
        s1, s2 = speculators_q(theirs, target, ids, int(q1.argmax()))
        worst = max(worst, float((q1 - s1).abs().max()), float((q2 - s2).abs().max()))
    return worst


def reloads_exactly(ours, back, target) -> bool:
    return all(torch.equal(a, b) for seed in range(3)
               for a, b in zip(opttree_q(ours, target, prompt(seed)), opttree_q(back, target, prompt(seed))))


def check(work: Path, target_dir: Path, target, spelling: str, before: bool) -> tuple[float, bool]:
    name = f"{spelling.rstrip('.')}-nbr{int(before)}"
    source = write_eagle3(work / name, target, spelling=spelling, norm_before_residual=before)
    converted = work / f"{name}-converted"
    Eagle3Converter().convert(source, converted, base_model=str(target_dir), norm_before_residual=before)
    ours, back = opttree.load_draft(source, target), opttree.load_draft(converted, target)
    worst, exact = max_dq(ours, load_speculators(converted), target), reloads_exactly(ours, back, target)
    ok = worst <= TOLERANCE and exact
    print(f"speculators {name:14s} max|dq| depth 1-2 {worst:.2e} (<= {TOLERANCE:g}), "
          f"converted folder reloads bit-identical: {exact}  {'OK' if ok else 'FAIL'}", flush=True)
    return worst, ok


def control(work: Path, target_dir: Path, target) -> bool:
    """The check can fail: a folder converted with norm_before_residual flipped drafts other q."""
    source = write_eagle3(work / "control", target)
    Eagle3Converter().convert(source, work / "control-converted", base_model=str(target_dir), norm_before_residual=True)
    moved = max_dq(opttree.load_draft(source, target), load_speculators(work / "control-converted"), target)
    print(f"speculators control: norm_before_residual flipped in the conversion moves q by {moved:.2e} (> 1e-3)  "
          f"{'OK' if moved > 1e-3 else 'FAIL'}", flush=True)
    return moved > 1e-3


def main() -> int:
    torch.set_num_threads(1)
    target = target_for("llama")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        target.save_pretrained(work / "target")
        results = [check(work, work / "target", target, spelling, before) for spelling, before in CASES]
        caught = control(work, work / "target", target)
    worst = max(r[0] for r in results)
    failed = sum(not r[1] for r in results) + (not caught)
    print(f"speculators: {len(results) - failed}/{len(results)} layouts agree, max|dq| {worst:.2e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
