"""The budget: how big a tree each step can afford, ``nodes="auto"`` / ``threshold="auto"``.

The loop asks a budget policy for each step's plan and tells it what the step cost; the seam
itself (:class:`~opttree.tree.plan.StepPlan`, :class:`~opttree.tree.plan.BudgetPolicy`, the fixed
policy) lives with the tree builders that read it, in :mod:`opttree.tree.plan`. This folder holds
the measured policy:

* :mod:`.calibration`: :func:`~.calibration.policy_maker`, the entry the generate() face calls: each
  row's policy, fixed or ``"auto"``'s on the pair's latency model, :func:`~.calibration.calibrate`d
  once: remembered by the process, else read from its file, else measured;
* :mod:`.policy`: :class:`~.policy.AutoPolicy` and the pure decisions it makes each step;
* :mod:`.latency`: the :class:`~.latency.LatencyModel` it plans with (T(n), c(w)), refreshed by every step;
* :mod:`.reliability`: how far the draft's p̂ is to be trusted, learnt online;
* :mod:`.calibration_file`: the calibrations on disk: where, read and written, and what a file must
  hold before any of it is used;
* :mod:`.timing`: measuring the pair on this machine, as decoding runs it.

May import: :mod:`opttree.drafters` (calibration times a drafter through its interface),
:mod:`opttree.tree`, :mod:`opttree.hf`, :mod:`opttree.kernels`. Imported by :mod:`opttree.integration` (the policies) and by
:mod:`opttree.loading` (``dtype="auto"`` keeps its choice beside the calibrations, in their folder).
"""
