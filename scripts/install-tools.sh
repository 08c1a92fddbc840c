#!/usr/bin/env bash
# Install the Debian packages the suite runs for real, when any of their programs is missing:
# prometheus (prometheus, promtool), prometheus-alertmanager (alertmanager, amtool), victoria-metrics
# (victoria-metrics, vmalert: the second central ruler of tests/test_central_rulers.py), and cmake
# and g++ to build llama.cpp's llama-server (scripts/build-llama-server.sh), and chromium for the
# headless screenshots of the HTML reports (tests/test_screenshots.py), and postgresql (the catalog
# of the Iceberg fleet tests, started by tests/support/postgres.py). Needs root (CI runs
# as root) or sudo; otherwise says what to run.
set -euo pipefail
# program:package
needed="prometheus:prometheus promtool:prometheus prometheus-alertmanager:prometheus-alertmanager
amtool:prometheus-alertmanager victoria-metrics:victoria-metrics vmalert:victoria-metrics
cmake:cmake g++:g++ chromium:chromium"
missing=() packages=()
for pair in $needed; do
  tool="${pair%%:*}" package="${pair##*:}"
  if ! command -v "$tool" >/dev/null 2>&1; then
    missing+=("$tool")
    case " ${packages[*]:-} " in *" $package "*) ;; *) packages+=("$package") ;; esac
  fi
done
# PostgreSQL (the Iceberg catalog of tests/test_lake_fleet.py): Debian keeps initdb and pg_ctl in
# /usr/lib/postgresql/<version>/bin, off PATH (tests/support/postgres.py looks there too)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=("initdb")
  packages+=("postgresql")
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages for: ${missing[*]}"
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "error: ${missing[*]} missing and not root; run: apt-get install ${packages[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
# The packages start system services; tests run their own instances on free ports.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics postgresql; do
  $sudo systemctl stop "$svc" >/dev/null 2>&1 || $sudo service "$svc" stop >/dev/null 2>&1 || true
done
