"""The edge node's model files: GGUF checks, packaged models, the hub, quantizing, the demo model, the tokenizer."""
