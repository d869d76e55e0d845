"""Local training over flat parameter vectors: flat model views, gradient oracles, the local solver."""
