#!/usr/bin/env bash
# Installs the Debian packages Ember builds and tests with, only those missing.
# Usage: scripts/deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # compiler and build
  clang libclang-rt-dev              # second compiler; libFuzzer and sanitizer runtimes
  libcmocka-dev                      # unit tests
  libjansson-dev                     # JSON (safetensors headers, config.json)
  libssl-dev                         # SHA-256 through OpenSSL EVP
  libpcre2-dev                       # pre-tokenizer regular expressions (text/)
  libmicrohttpd-dev                  # HTTP server (server/, `ember serve`)
  liburing-dev                       # batched expert reads (experts/, io_uring)
  curl jq wrk                        # server tests (curl, jq) and bench/bench_server.sh (wrk)
  nodejs npm                         # the ggml reference test installs its npm prebuilt
  python3 python3-numpy python3-jinja2 # test scripts: JSON, make_k3_hf.py (NumPy), chat templates
)

missing=()
for p in "${packages[@]}"; do
  # a package counts as present when dpkg says so, or (nodejs/npm) when the tool is on PATH
  case "$p" in
    nodejs) command -v node >/dev/null 2>&1 && continue ;;
    npm) command -v npm >/dev/null 2>&1 && continue ;;
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
