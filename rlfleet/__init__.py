"""rlfleet: deep reinforcement learning with clean algorithms and parallel actor-learner architectures."""
