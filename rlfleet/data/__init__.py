"""rlfleet.data."""

from rlfleet.data.batch import Batch
from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer
from rlfleet.data.segment_tree import MinTree, SumTree

__all__ = ["Batch", "MinTree", "PrioritizedReplayBuffer", "ReplayBuffer", "SequenceReplayBuffer", "SumTree"]
