"""Calibrating the simulator to declared targets, and validating it on held-out ones.

* ``protocol``: the validation protocol (results/validation/protocol.yaml): the readings,
  arrivals, ``n_problems`` and seeds, and three disjoint sets of target ids, read and
  checked once, with its version and hash.
* ``targets``: every paper number the sim can produce, built once by id; the protocol
  selects what the sim is fitted to (``CALIBRATION``), what may be looked at while
  building (``DEVELOP``) and what is scored only as a logged look (``SEALED``); each
  target names the sim cells it needs and how to read its number from their summaries.
* ``params``: the named constants the fit may move, with bounds (at most 8).
* ``evaluate``: runs the cells a set of targets needs, in parallel, for given constants
  and seeds (a prediction is the mean over the seeds).
* ``fit``: ``scipy.optimize.least_squares`` over the constants, residuals scaled by each
  target's tolerance; reports every residual and which targets it could not reach.

Commands: ``python -m specscale.calibration`` (fit, write the calibrated profile) and
``python -m analysis.validate`` (predicted vs paper on the develop targets; ``--sealed``
scores the sealed ones and appends the look to results/validation/looks.csv).
"""
