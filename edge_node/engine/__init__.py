"""The edge node's engine: continuous batching on llama.cpp's low-level API, slots, sampling, hand-off to the loop."""
