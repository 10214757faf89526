"""How big a tree each step drafts and verifies: one explicit seam, :class:`BudgetPolicy`.

This module only gathers the names of three others (import from here or from them):

* :mod:`opttree.plan`: the seam builders and the loop use (:class:`StepPlan`, :class:`LayerState`,
  :class:`BudgetPolicy`, :class:`FixedPolicy`); nothing heavy imported;
* :mod:`opttree.latency`: ``nodes="auto"`` / ``threshold="auto"``: the :class:`LatencyModel`, the
  pure decisions on it (speed(m), the next layer's guess, the width cap) and :class:`AutoPolicy`;
* :mod:`opttree.calibration`: measuring the latency model, its on-disk cache (thread-safe),
  and :func:`policy_maker` / :func:`make_policy`, the loop's entry point.
"""

from __future__ import annotations

from .calibration import (CALIBRATION_PREFIX, CALIBRATION_VERSION, DRAFT_WIDTHS, MIN_CALIBRATION_PREFIX, REPEATS,
                          VERIFY_SIZES, cache_dir, cache_mode, calibrate, calibration_key, calibration_prefix,
                          clear_calibrations, drafter_fingerprint, from_json, known_latency, lower_envelope,
                          make_policy, measure, policy_maker, measure_drafter, measure_verify, model_fingerprint, read_cached,
                          to_json, write_cached)
from .latency import (AUTO_MAX_NODES, MIN_WIDTH, REFRESH, SIZE_REFRESH, START_SIZE, WIDTH_PER_NODE, AffineFit,
                      AutoPolicy, LatencyModel, LatencyTable, best_choice, best_size, expected_speed, layer_pays,
                      layer_width, next_layer_guess)
from .plan import BudgetPolicy, FixedPolicy, LayerState, StepPlan

__all__ = ["AUTO_MAX_NODES", "AffineFit", "AutoPolicy", "BudgetPolicy", "CALIBRATION_PREFIX", "CALIBRATION_VERSION",
           "DRAFT_WIDTHS", "FixedPolicy", "LatencyModel", "LatencyTable", "LayerState", "MIN_CALIBRATION_PREFIX",
           "MIN_WIDTH", "REFRESH", "REPEATS", "SIZE_REFRESH", "START_SIZE", "StepPlan", "VERIFY_SIZES",
           "WIDTH_PER_NODE", "best_choice", "best_size", "cache_dir", "cache_mode", "calibrate", "calibration_key",
           "calibration_prefix", "clear_calibrations", "drafter_fingerprint", "expected_speed", "from_json",
           "known_latency", "layer_pays", "layer_width", "lower_envelope", "make_policy", "measure",
           "measure_drafter", "measure_verify", "model_fingerprint", "next_layer_guess", "policy_maker", "read_cached", "to_json",
           "write_cached"]
