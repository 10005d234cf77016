"""The gateway's pools of backends: edge nodes and vLLM servers, with the one circuit breaker both use."""
