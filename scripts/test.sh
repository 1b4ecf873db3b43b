#!/usr/bin/env bash
# Runs Conveyor's tests on a fresh machine: installs what they need first (headless Chromium
# and chromedriver for the dashboard test, cargo-nextest), starts the local PostgreSQL if it is
# down, then runs every test (nextest) and the doc tests. `.ci/run` runs this after fmt/clippy.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian's Chromium and chromedriver (fonts-liberation gives the screenshots Arial-metric text).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  as_root apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq \
    chromium chromium-driver fonts-liberation >/dev/null
fi

# PostgreSQL: the PostgreSQL tests use the local server for real; start it if it is down.
if command -v pg_isready >/dev/null && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi

command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked

cargo nextest run --workspace "$@"
cargo test --workspace --doc
