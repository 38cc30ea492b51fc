#!/usr/bin/env bash
# Stop the node hack/up.sh started and remove everything it created (processes, mounts, devices,
# iptables rules); the caches in ~/.cache/pko stay.
set -euo pipefail
exec python3 "$(cd "$(dirname "$0")" && pwd)/localnode.py" down
