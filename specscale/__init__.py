"""SpecScale harness: speculative PRM-guided beam search served on one GPU."""
