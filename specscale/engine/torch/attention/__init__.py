"""Attention over the paged KV cache: the batch a forward reads and how it is built, the
cache itself, the torch reference, FlashInfer (CUDA), the opt-in C decode kernel (CPU), and
the choice between them (``select``)."""
