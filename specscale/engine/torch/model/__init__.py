"""The networks: Qwen2 / Llama decoders, their layers and hot ops, checkpoint loading, the
stored configs of the paper's models."""
