"""rlfleet.data."""

from rlfleet.data.batch import Batch
from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer
from rlfleet.data.priority import PriorityIndex, importance_weights
from rlfleet.data.segment_tree import MinTree, SumTree

__all__ = [
    "Batch",
    "MinTree",
    "PrioritizedReplayBuffer",
    "PriorityIndex",
    "ReplayBuffer",
    "SequenceReplayBuffer",
    "SumTree",
    "importance_weights",
]
