"""tiergate's cloud tier: the gateway-side pool of vLLM servers and the tooling to stand them up.

- `pool.CloudPool`: discovery (static list, DNS), health and load polling, selection, circuit breaking.
- `selection`: prefix-affine (rendezvous hashing bounded by load), round-robin and least-load ordering.
- `breaker`, `vllm_metrics` (parsing vLLM's /metrics), `metrics` (tiergate_cloud_* series).
- `spec`, `render`, `process`, `cli` (`cloud-pool check/render/launch/tiny-model`), `tiny_model`.
"""
