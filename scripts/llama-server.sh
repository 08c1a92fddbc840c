#!/usr/bin/env bash
# Start a real llama.cpp llama-server on loopback, for the real-engine tests and for trying
# headroom against a real engine by hand. Builds it first when it is not cached
# (scripts/build-llama-server.sh; a few minutes the first time).
#
# Usage: scripts/llama-server.sh [--parallel N] [--port PORT] [--threads T] [-- LLAMA-SERVER ARGS]
#   --parallel N   server slots (default 4): the engine serves N requests at once, queues the rest
#   --port PORT    loopback port (default: a free one)
#   --threads T    CPU threads for generation (default 1, leaving a core for the client)
# Example:
#   scripts/llama-server.sh --parallel 4 --port 8080 &
#   headroom probe --url http://127.0.0.1:8080 --levels 1,2,4,8 --max-tokens 32
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
parallel=4 port="" threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --parallel) parallel="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$parallel" in ''|*[!0-9]*) echo "error: --parallel $parallel is not a positive integer" >&2; exit 2 ;; esac
paths="$(bash "$here/build-llama-server.sh")"
binary="$(echo "$paths" | tail -n 2 | head -n 1)"
model="$(echo "$paths" | tail -n 1)"
if [ -z "$port" ]; then
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
echo "llama-server: http://127.0.0.1:$port  (--parallel $parallel, --threads $threads, $(basename "$model"))" >&2
# 1,024 tokens of context per slot: the probe's prompts and outputs are far shorter.
exec "$binary" --model "$model" --host 127.0.0.1 --port "$port" --parallel "$parallel" \
  --ctx-size $((parallel * 1024)) --threads "$threads" --metrics --log-disable "$@"
