#!/usr/bin/env bash
# README command 1: set up (if needed) and run the whole product on this machine:
# gateway on 127.0.0.1:8080, a llama.cpp edge node, a cloud stand-in, the in-memory semantic cache.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/tiergate demo "$@"
