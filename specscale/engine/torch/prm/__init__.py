"""The process reward model: its forward over packed rows, its flat batches, its cost curve."""
