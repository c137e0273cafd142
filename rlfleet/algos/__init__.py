"""rlfleet.algos."""
