"""Monitors for any `trl.GRPOTrainer` subclass (`RGPOTrainer`, `PPORLHFTrainer`, TRL's losses), as mixins put
before the trainer in the bases; they log, never change the loss:

- `ReferenceKLMonitor`: ``kl_ref/monitor``, the k3 KL of each generation batch to the reference policy, for
  every method (it builds the reference itself where TRL has none, beta = 0);
- `BehaviourRatioMonitor`: ``behaviour/*``, the importance ratio to the behaviour policy per loss call (how
  stale the samples are when a generation batch serves several optimizer steps).

::

    class MonitoredRGPOTrainer(BehaviourRatioMonitor, ReferenceKLMonitor, RGPOTrainer):
        pass
"""

from .behaviour_ratio import BEYOND, BehaviourRatioMonitor, behaviour_ratio_sums
from .reference_kl import ReferenceKLMonitor

__all__ = ["BEYOND", "BehaviourRatioMonitor", "ReferenceKLMonitor", "behaviour_ratio_sums"]
