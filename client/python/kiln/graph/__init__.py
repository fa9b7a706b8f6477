"""Building the captured FX graph and the fake values that give its tensors their metadata."""
