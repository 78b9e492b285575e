"""The results store: one directory per cell, resumable sweeps, an index, tracking."""
