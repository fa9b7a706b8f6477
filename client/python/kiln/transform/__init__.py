"""The transformed code: what a frame runs instead of its own bytecode once captured."""
