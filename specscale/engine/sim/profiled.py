"""A cost model predicted from measurements of a real engine (``hardware=profiled/<name>``).

The roofline (cost_model.py) prices hardware nobody here has; a *profile* prices the
machine at hand: ``runners.profile_engine`` times the torch engine's generation
iterations and PRM batches over a grid and this module fits, per kind of work, a small
non-negative linear model over the features the roofline itself uses:

* generation iteration: 1, decode rows, decode context tokens (KV read), decode keys as
  a padded attention gathers them (rows x longest context), prefill tokens, prefill
  attention pairs (query x key), rows that need logits (LM head);
* PRM batch: 1, tasks, new tokens, cached tokens (the KV each task reads back), new x
  cached tokens (attention over the cache), new-token pairs, and tasks with no cached
  prefix (they run a different attention path: on the CPU 16 tasks of 8 new tokens took
  4.1 ms uncached against 2.6 ms over a 128-token cached prefix), and the
  padded group the cached tasks form (tasks x longest context keys; x longest new piece
  query-key pairs).

Padding is why the profile times ragged batches too: with uniform rows a padded and a
ragged cost are the same number, and the fit could not tell which one the engine pays
(on the CPU, serving cells with prompts of 50-450 tokens measured 1.2-1.5x the device time
the uniform-batch profile predicted for their iterations, a gap that also holds the
in-loop effect ``in_loop`` now measures).

Non-negative least squares (``scipy.optimize.nnls``) keeps every coefficient a cost, so
a fitted model never predicts negative time; it minimises *relative* error (each
measurement weighted by 1/seconds), because the points span 1 ms launches to 100 ms
batches and a plain fit would give the large ones all the weight and the small ones,
which a serving loop runs by the thousand, errors of 50% and more. A query outside the measured range of any
feature is *extrapolated*: still predicted by the same line, and counted
(``ProfiledCostModel.extrapolated`` -> the summary's ``cost_model_extrapolated``), so a
result that leans on extrapolation says so. Memory capacity still comes from the
roofline dimensions of the models and the profile's memory size.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from specscale.clock import HostCostModel
from specscale.engine.cost_profile import GEN_FEATURES, PRM_FEATURES, CostProfile, gen_features, prm_features
from specscale.engine.sim.cost_model import CostModel


_DECODE_ROWS, _PREFILL_TOKENS = GEN_FEATURES.index("decode_rows"), GEN_FEATURES.index("prefill_tokens")
_NEW_TOKENS = PRM_FEATURES.index("new_tokens")


class ProfiledCostModel(CostModel):
    """The roofline model's memory accounting with timings predicted from a profile."""

    profile: CostProfile
    speed: Any = None  # SpeedCheck: this machine's probe against the profile's (None: not checked)

    @classmethod
    def with_profile(cls, base: CostModel, profile: CostProfile) -> "ProfiledCostModel":
        model = cls.__new__(cls)
        model.__dict__.update(base.__dict__)
        model.profile = profile
        model.extrapolated = 0
        return model

    def host_model(self) -> HostCostModel:
        """Host seconds per generation iteration and per PRM batch, fitted to measured gaps."""
        return self.profile.host

    def generation_seconds(self, decode_ctx_lens, prefill_chunks, n_logit_rows: int) -> float:
        x = gen_features(decode_ctx_lens, prefill_chunks, n_logit_rows)
        if x[_DECODE_ROWS] == 0 and x[_PREFILL_TOKENS] == 0:  # no tokens: no forward (a prefill-only
            return 0.0                                         # iteration, the first wave or a recompute, has one)
        s, outside = self.profile.generation.predict(x)
        self.extrapolated += outside
        return s * self.profile.in_loop["generation"]

    def prm_seconds_groups(self, groups: Sequence[tuple[int, float, float]]) -> float:
        """The profile has no closed form over groups: the tasks, one by one."""
        return self.prm_seconds([(n, c) for k, n, c in groups for _ in range(int(k))])

    def prm_seconds(self, tasks: Sequence[tuple[int, int]]) -> float:
        x = prm_features(tasks)
        if x[_NEW_TOKENS] == 0:
            return 0.0
        s, outside = self.profile.prm.predict(x)
        self.extrapolated += outside
        return s * self.profile.in_loop["prm"]


def cost_model_for(model_cfg: Mapping[str, Any], hardware_cfg: Mapping[str, Any], cost_cfg: Any,
                   speed: Any = None, **kw: Any) -> CostModel:
    """The roofline cost model, or a profiled one when the hardware config carries a
    ``profile`` (conf/hardware/profiled/<name>.yaml, written by runners.profile_engine).
    speed: the profile's SpeedCheck on this machine (engine/profile_speed.py); when it says
    ``rescaled``, the profile is priced at this machine's probed speed."""
    hw = dict(hardware_cfg)
    profile = hw.pop("profile", None)
    base = CostModel.from_configs(model_cfg, hw, cost_cfg, **kw)
    if profile is None:
        return base
    prof = CostProfile.from_dict(profile)
    if speed is not None and speed.rescaled:
        prof = prof.rescaled(*speed.factors())
    model = ProfiledCostModel.with_profile(base, prof)
    model.speed = speed
    return model
