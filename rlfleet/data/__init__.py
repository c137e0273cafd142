"""rlfleet.data."""
