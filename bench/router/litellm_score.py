"""Score prompts with LiteLLM's rule-based complexity router. Runs INSIDE the LiteLLM virtualenv.

    .venv-litellm/bin/python bench/router/litellm_score.py PROMPTS.json OUT.json

PROMPTS.json is a JSON list of strings. OUT.json gets {"version", "scores", "tiers", "latency_ms"}: the
router's weighted complexity score (what its tier boundaries cut) and its tier for every prompt, and the
per-call latency of `ComplexityRouter.classify`, the method LiteLLM's router calls for each request.
"""

from __future__ import annotations

import json
import sys
import time
from importlib import metadata
from unittest.mock import MagicMock


def main() -> None:
    # LiteLLM exists only in its own virtualenv (this script's), never in tiergate's
    import litellm
    from litellm.router_strategy.complexity_router.complexity_router import ComplexityRouter

    with open(sys.argv[1]) as f:
        prompts = json.load(f)
    # The tiers only name models; scoring never calls them. SIMPLE/MEDIUM = weak, COMPLEX/REASONING = strong.
    router = ComplexityRouter(model_name="bench", litellm_router_instance=MagicMock(), complexity_router_config={
        "tiers": {"SIMPLE": "weak", "MEDIUM": "weak", "COMPLEX": "strong", "REASONING": "strong"}})
    scores, tiers, lat = [], [], []
    for p in prompts:
        t0 = time.perf_counter_ns()
        tier, score, _signals = router.classify(p)
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        scores.append(float(score))
        tiers.append(str(getattr(tier, "value", tier)))
    version = getattr(litellm, "__version__", None)
    if version is None:
        version = metadata.version("litellm")
    with open(sys.argv[2], "w") as f:
        json.dump({"version": version, "scores": scores, "tiers": tiers, "latency_ms": lat}, f)


if __name__ == "__main__":
    main()
