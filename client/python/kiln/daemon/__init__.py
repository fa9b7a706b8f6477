"""Talking to kilnd: the kiln.v1 messages, the client's settings (read from the environment in
one place), the client that finds or starts a daemon, and the checks an artifact passes before
the runtime loads it."""
