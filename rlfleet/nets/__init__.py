"""rlfleet.nets."""
