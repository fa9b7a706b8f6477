"""Variable trackers: what the symbolic executor knows about each Python value, one class per
kind of value."""
