"""Distil a small same-vocabulary draft model from a target model (``opttree distill``).

Pipeline: :mod:`.prompts` / :mod:`.sources` (self-made prompts, long-document tasks and
teacher-forced texts from the machine) → :mod:`.data` (the target's greedy answers and top-k
logits, cached and resumable) → :mod:`.features` (the target's hidden states, for a feature head)
→ :mod:`.head_train` (an EAGLE-style head, :mod:`.head`) or :mod:`.train` (an independent draft,
:mod:`.model`) → a draft folder, which :func:`opttree.load_draft` loads. :mod:`.recipe` /
:mod:`.recipe_run`: the whole of it from one recipe file (``opttree distill --recipe``), in the
precision measured fastest on the machine (:mod:`.precision`), training resumable by optimizer step
(:mod:`.checkpoint`); :mod:`.resident`: a round in one process on a GPU, against a clock; both train
their stages through :mod:`.stages`. Cache shards are safetensors (:mod:`.shards`); :mod:`.depths` and
:mod:`.coverage` measure agreement along an accepted path and the kept vocabulary.
The command: :mod:`.cli` (``opttree distill``; :mod:`.__main__` for ``python -m``), :mod:`.pipeline`
(prompts → answers → a trained draft in one call), :mod:`.targets` (the target a draft is made for).
:mod:`.eagle3`: a head trained in the EAGLE-3 layout itself (``--kind eagle3``).
The prompts' kinds: :mod:`.chat_prompts`. A feature head's batches and loss: :mod:`.head_data`,
:mod:`.head_loss`.

Training writes the runtime's formats and imports :mod:`opttree.loading` (the folders' files, the
machine, the timing in turns); nothing of the runtime imports this package.
"""

from .model import init_draft

__all__ = ["init_draft"]
