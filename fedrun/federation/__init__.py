"""The round loop, client blocks, participation patterns and delay metrics."""
