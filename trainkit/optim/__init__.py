"""What updates the weights: optimizer and schedule (optimizer.py), the non-finite step guard
(nonfinite.py), and the exponential moving average of the weights (ema.py)."""
