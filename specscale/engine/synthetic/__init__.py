"""The synthetic workload (token overlap, step lengths, EOS, PRM scores, latent
correctness) and its problems: what engine=sim serves, and what the torch engine's
synthetic-token mode serves with real forward passes (``build`` makes both from a cell spec)."""
