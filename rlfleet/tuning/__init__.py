"""Hyperparameter sweeps on Ray Tune (`rlfleet tune`, `rlfleet.tune`): the search space (`space`), what a sweep is
and keeps in its folder (`spec`), running it and its trials (`sweep`), and what it shows at its end (`report`)."""
