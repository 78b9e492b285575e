"""Real-model backend: Qwen2 / Llama generators and PRMs over a paged KV cache.

``model/`` the networks and their checkpoints, ``attention/`` attention over the paged
KV cache and the batches it reads, ``prm/`` the process reward model, ``runtime/`` the
model runner (memory plan, CUDA graphs, device timers); ``backend.py`` puts them behind
the Backend protocol and ``build.py`` makes them from a cell spec.
"""
