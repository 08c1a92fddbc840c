#!/usr/bin/env bash
# Run a command with the wall clock moved ahead (default 30 days), the monotonic clock real:
#
#   scripts/clock-ahead.sh 30 make test        # what `make test-clock-ahead` runs
#   scripts/clock-ahead.sh 400 .venv/bin/pytest tests/test_service_jobs.py
#
# Every process the command starts that reads the clock through libc (Python, DuckDB, PostgreSQL,
# llama-server) sees the moved date; Go programs (Prometheus, Alertmanager, VictoriaMetrics) read
# the kernel's clock directly and keep today's: a test must not depend on the two agreeing either.
# Needs Debian's faketime (installed when missing, as root) and cc for a 10-line shim
# (scripts/clock-ahead/nanosleep.c, built once into ~/.cache/llm-headroom).
set -euo pipefail
days="${1:?usage: scripts/clock-ahead.sh DAYS COMMAND...}"
shift
if ! command -v faketime >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "error: faketime missing; run: apt-get install faketime" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/llm-headroom"
shim="$cache/clock-ahead-nanosleep.so"
source="$(dirname "$0")/clock-ahead/nanosleep.c"
if [ ! -f "$shim" ] || [ "$source" -nt "$shim" ]; then
  mkdir -p "$cache"
  cc -shared -fPIC -O2 -o "$shim" "$source"
fi
echo "clock-ahead: wall clock +${days}d ($(FAKETIME_DONT_FAKE_MONOTONIC=1 faketime -f "+${days}d" date -u +%FT%TZ))" >&2
export LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}" FAKETIME_DONT_FAKE_MONOTONIC=1
exec faketime -f "+${days}d" "$@"
