"""rlfleet.envs."""
