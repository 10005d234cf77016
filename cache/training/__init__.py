"""Training-time code: exporting the embedder and training the verifier (torch, once, at set-up).

Serving code never imports this package.
"""
