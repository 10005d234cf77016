"""The distillation flywheel's training side: captured cloud answers → a LoRA adapter in GGUF → a gated verdict.

Set-up-time code on torch, transformers and peft (the `train` extra, `pip install 'tiergate[train]'`). The gateway
and the edge node never import it (tests/test_layers.py checks); `tiergate distill train` runs it in a child
process. The edge node only loads the GGUF adapter this package writes (`edge-node serve --lora`).
"""
