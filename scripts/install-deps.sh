#!/usr/bin/env bash
# Debian packages the build and the tests need (used by .ci/run; run it once on a fresh machine).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build git ca-certificates \
  libgtest-dev nlohmann-json3-dev libcpp-httplib-dev libssl-dev libpcre2-dev \
  python3 python3-jinja2 python3-numpy python3-jsonschema
# Node.js for the SDK end-to-end tests. Machines that already carry a Node.js build (NodeSource's
# nodejs package bundles npm and conflicts with Debian's npm) keep theirs.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
