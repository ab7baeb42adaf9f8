"""The recipe's synchronous trainers with the library's monitors mixed in (put first in the bases, they never
change the loss): KL to the reference for every method (`rgpo_trl.monitors.ReferenceKLMonitor`, the paper's
primary RLHF stability metric) and, for the GRPO family, the ratio to the behaviour policy
(`rgpo_trl.monitors.BehaviourRatioMonitor`). TRL's GRPOTrainer carries `MismatchedSamplerMixin`, which
changes nothing unless the config (`GRPOSamplerConfig`, the recipe's) turns the in-process sampler on. The
recipe builds them in plain view (`recipes/hh_rlhf_qwen.py`)."""

from __future__ import annotations

from trl import GRPOTrainer

from rgpo_trl.monitors import BehaviourRatioMonitor, ReferenceKLMonitor
from rgpo_trl.trainer import PPORLHFTrainer, RGPOTrainer
from rgpo_trl.trainer.sync_sampler import MismatchedSamplerMixin


class RGPOMonitoredTrainer(BehaviourRatioMonitor, ReferenceKLMonitor, RGPOTrainer):
    pass


class GRPOMonitoredTrainer(BehaviourRatioMonitor, ReferenceKLMonitor, MismatchedSamplerMixin, GRPOTrainer):
    pass


class PPORLHFMonitoredTrainer(ReferenceKLMonitor, PPORLHFTrainer):
    pass
