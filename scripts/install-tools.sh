#!/usr/bin/env bash
# Install Debian's prometheus (promtool, prometheus), prometheus-alertmanager (amtool, alertmanager)
# and chromium (headless screenshots of the HTML reports) when any of them is missing. Needs root (CI
# runs as root); otherwise says what to run.
set -euo pipefail
missing=()
for tool in prometheus promtool prometheus-alertmanager amtool chromium; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages for: ${missing[*]}"
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "error: ${missing[*]} missing and not root; run: apt-get install prometheus prometheus-alertmanager chromium" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager chromium >/dev/null
# The packages start system services; tests run their own instances on free ports.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
  $sudo systemctl stop "$svc" >/dev/null 2>&1 || $sudo service "$svc" stop >/dev/null 2>&1 || true
done
