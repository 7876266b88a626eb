#!/usr/bin/env bash
# Make `tshark` available, non-interactively; idempotent.
#   - already on PATH: do nothing (exit 0)
#   - root: preseed "no setuid dumpcap" (the debconf question would otherwise block), apt-get install tshark
#   - not root and not installed: explain and exit 1
#   - LOGBUF_NO_INSTALL=1 (the test suite sets it): never install; exit 1 if tshark is missing
set -euo pipefail

if command -v tshark >/dev/null 2>&1; then
    exit 0
fi
if [ "${LOGBUF_NO_INSTALL:-0}" = "1" ]; then
    echo "ensure-tshark: tshark is not installed (LOGBUF_NO_INSTALL=1: not installing; ./run test installs it)" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-tshark: tshark is not installed and installing it needs root (apt-get install tshark)" >&2
    exit 1
fi
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq tshark >/dev/null
command -v tshark >/dev/null 2>&1 || { echo "ensure-tshark: install finished but tshark is not on PATH" >&2; exit 1; }
