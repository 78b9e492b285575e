"""The engine: physical sequences and their scheduling, KV blocks, the paired sampler and
the Backend protocol (this folder), the backends (sim/, torch/, vllm/) and what they share
(text/, synthetic/); docs/design.md §6 has the map."""
