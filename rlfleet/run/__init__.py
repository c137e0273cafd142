"""rlfleet.run."""
