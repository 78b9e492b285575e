"""engine=sim: the synthetic workload on a virtual clock, priced by a roofline cost model
of the paper's models and GPUs (or by a measured profile: profiled.py)."""
