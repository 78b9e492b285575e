"""Running the generator: the model runner, CUDA-graph decode, the KV memory plan, device
timers."""
