"""Run outputs: per-round JSONL records and the progress line on rank 0."""
