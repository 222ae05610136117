"""The checkpoints users have, both directions: `model.init_from` (its model's shape: shape.py; its
weights: load.py), `trainkit export` (export.py), and the normalisation statistics that travel with
them (norm_stats.py)."""
