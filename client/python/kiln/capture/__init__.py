"""The symbolic executor: bytecode in, graph and guards out."""
