"""Architecture facts of the paper's models, and the counts derived from them.

Only the dimensions are stored (copied from each model's public ``config.json``);
parameter counts, bytes and FLOPs are always computed, never hard-coded, so a
wrong dimension shows up as a wrong parameter count in the tests.

Supported families are dense decoder-only transformers with grouped-query
attention, RMSNorm and a gated (SwiGLU) MLP: Qwen2 (bias on q/k/v projections)
and Llama (no biases).

Heads:
  * ``lm``         a causal-LM head, ``vocab_size x hidden_size`` (may be tied to the
                   input embedding).
  * ``classifier`` Qwen2.5-Math-PRM: ``Linear(h, h) -> ReLU -> Linear(h, 2)`` (both
                   with bias) replaces the LM head; applied at every position.
  * ``lm_tokens``  RLHFlow Llama PRM: a full causal LM whose score is read from the
                   logits of two tokens ("+" / "-"), so a serving engine only needs
                   those two rows of the unembedding per scored position. The full
                   head still lives in memory (it is part of the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

ARCHS = ("qwen2", "llama")
HEADS = ("lm", "classifier", "lm_tokens")

# Keys that may sit beside the dimensions in conf/model/*.yaml (e.g. the PRM's
# prompt format) but are not architecture facts; from_config skips them.
NON_DIM_KEYS = frozenset({"format"})


@dataclass(frozen=True)
class ModelDims:
    hf_name: str
    arch: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    head: str = "lm"

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads (GQA)")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> "ModelDims":
        """Build from a mapping (dict or OmegaConf node) with the field names above.

        ``head_dim`` defaults to hidden_size // num_heads and ``head`` to "lm".
        Unknown keys raise ValueError (typos must not pass silently), except the
        non-architecture keys in NON_DIM_KEYS.
        """
        data = {k: mapping[k] for k in mapping.keys()}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - NON_DIM_KEYS)
        if unknown:
            raise ValueError(f"unknown ModelDims keys: {unknown}")
        data = {k: v for k, v in data.items() if k in names}
        if "head_dim" not in data:
            data["head_dim"] = int(data["hidden_size"]) // int(data["num_heads"])
        data.setdefault("head", "lm")
        ints = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size")
        for k in ints:
            data[k] = int(data[k])
        for k in ("tie_word_embeddings", "qkv_bias"):
            data[k] = bool(data[k])
        return cls(**data)

    # ---- parameter counts -------------------------------------------------------

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of the GEMMs in one decoder layer (q, k, v, o, gate, up, down)."""
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def layer_params(self) -> int:
        """All parameters of one decoder layer: GEMM weights, q/k/v biases, 2 RMSNorms."""
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return self.layer_matmul_params + bias + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def body_params(self) -> int:
        """Decoder layers plus the final RMSNorm (everything but embedding and head)."""
        return self.num_layers * self.layer_params + self.hidden_size

    @property
    def classifier_params(self) -> int:
        h = self.hidden_size
        return (h * h + h) + (h * 2 + 2)

    @property
    def head_params(self) -> int:
        """Parameters the head adds to the checkpoint (0 for a tied LM head)."""
        if self.head == "classifier":
            return self.classifier_params
        return 0 if self.tie_word_embeddings else self.embedding_params

    @property
    def head_read_params(self) -> int:
        """Head weights streamed from HBM by one forward pass that uses the head.

        A tied LM head still reads the (shared) embedding matrix; an ``lm_tokens``
        head reads only the two unembedding rows whose logits form the score.
        """
        if self.head == "classifier":
            return self.classifier_params
        if self.head == "lm_tokens":
            return 2 * self.hidden_size
        return self.embedding_params

    @property
    def n_params(self) -> int:
        return self.embedding_params + self.body_params + self.head_params

    @property
    def n_params_non_embedding(self) -> int:
        """n_params without the input embedding and without an LM unembedding.

        (Kaplan et al.'s convention; a classifier head is counted as non-embedding.)
        """
        return self.body_params + (self.classifier_params if self.head == "classifier" else 0)

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes the checkpoint occupies in device memory."""
        return self.n_params * dtype_bytes

    def body_read_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of weights one forward pass streams, excluding embedding and head."""
        return self.body_params * dtype_bytes

    def head_read_bytes(self, dtype_bytes: int = 2) -> int:
        return self.head_read_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    # ---- FLOPs ------------------------------------------------------------------

    @property
    def matmul_flops_per_token(self) -> int:
        """2 FLOPs per GEMM weight per token, decoder layers only.

        The embedding lookup is a gather (no FLOPs); the head is counted separately
        (lm_head_flops_per_row) because it runs only on rows whose output is used.
        Biases, norms and activations are elementwise and ignored (<0.1%).
        """
        return 2 * self.num_layers * self.layer_matmul_params

    @property
    def lm_head_flops_per_row(self) -> int:
        h = self.hidden_size
        if self.head == "classifier":
            return 2 * (h * h + h * 2)
        if self.head == "lm_tokens":
            return 2 * 2 * h
        return 2 * self.vocab_size * h

    @property
    def attention_flops_per_query_key(self) -> int:
        """QK^T (2*head_dim) plus PV (2*head_dim) per head, per layer, per (query, key) pair."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def attention_flops(self, q_tokens: int, cached_ctx: int = 0) -> int:
        """Attention-score FLOPs for ``q_tokens`` new tokens after ``cached_ctx`` cached ones.

        New token i (1-based) attends causally to cached_ctx + i keys, so the number
        of (query, key) pairs is q*c + q*(q+1)/2 and

            flops = 4 * num_layers * num_heads * head_dim * (q*c + q*(q+1)/2).

        A decode row with context ``ctx`` (including itself) is q=1, c=ctx-1, i.e.
        4*L*H*d*ctx. Query heads (not KV heads) set the count: GQA shares K/V storage,
        not the arithmetic.
        """
        q, c = int(q_tokens), int(cached_ctx)
        return self.attention_flops_per_query_key * (q * c + q * (q + 1) // 2)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name used in conf/model/*.yaml."""
    table = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
             "float32": 4, "fp32": 4, "float": 4, "float64": 8}
    try:
        return table[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(table)}") from None
