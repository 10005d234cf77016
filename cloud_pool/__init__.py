"""tiergate's vLLM deployment tooling: how to stand up the cloud tier's servers.

- `spec` (vLLM server specs, `specs/`), `render` (command line, Kubernetes manifests), `process` (a local vLLM
  process), `vllm_env`, `cli` (`cloud-pool check/render/launch/tiny-model`), `tiny_model`, `real_model`.

The gateway's pool of vLLM servers (discovery, health, selection, breaker) is `tiergate.gateway.pools.cloud`.
"""
