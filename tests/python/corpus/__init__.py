"""kiln's conformance corpus: small programs, one file per Python or PyTorch feature."""
