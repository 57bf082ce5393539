#!/usr/bin/env bash
# npm packages of the end-to-end tests (tests/e2e: the openai and @anthropic-ai/sdk SDKs), installed
# exactly as locked in tests/e2e/package-lock.json. Needs node and npm (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../tests/e2e"
npm ci --no-audit --no-fund --loglevel=error
