"""Federation layer: the round loop, participation patterns and delay metrics."""
