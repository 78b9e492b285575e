"""Calibrating the simulator to declared targets, and validating it on held-out ones.

* ``targets``: what the sim is fitted to (``CALIBRATION``) and what it is checked
  against (``VALIDATION``, never used to fit or choose anything); each target names the
  sim cells it needs and how to read its number from their summaries.
* ``params``: the named constants the fit may move, with bounds (at most 8).
* ``evaluate``: runs the cells a set of targets needs, in parallel, for given constants.
* ``fit``: ``scipy.optimize.least_squares`` over the constants, residuals scaled by each
  target's tolerance; reports every residual and which targets it could not reach.

Commands: ``python -m specscale.calibration`` (fit, write the calibrated profile) and
``python -m analysis.validate`` (predicted vs paper on the held-out targets).
"""
