"""The budget: how big a tree each step can afford, ``nodes="auto"`` / ``threshold="auto"``.

The loop asks a budget policy for each step's plan and tells it what the step cost; the seam
itself (:class:`~opttree.tree.plan.StepPlan`, :class:`~opttree.tree.plan.BudgetPolicy`, the fixed
policy) lives with the tree builders that read it, in :mod:`opttree.tree.plan`. This folder holds
the measured policy:

* :mod:`.latency`: the :class:`~.latency.LatencyModel` (T(n), c(w)), the pure decisions on it and
  :class:`~.latency.AutoPolicy`;
* :mod:`.reliability`: how far the draft's p̂ is to be trusted, learnt online;
* :mod:`.timing`: timing the pair on this machine, as decoding runs it;
* :mod:`.calibration`: those times kept per pair (in the process and on disk), and
  :func:`~.calibration.policy_maker`, the entry the generate() face calls;
* :mod:`.calibration_file`: what a cache file must hold before any of it is used.

May import: :mod:`opttree.tree`, :mod:`opttree.hf`, and :mod:`opttree.drafters` (calibration times
a drafter through its interface). Imported by :mod:`opttree.integration` (the policies) and by
:mod:`opttree.loading` (``dtype="auto"`` keeps its choice beside the calibrations, in their folder).
"""
