#!/usr/bin/env bash
# Runs Conveyor's tests on a fresh machine: installs what they need first (headless Chromium
# and chromedriver for the dashboard test, cargo-nextest, Node and the TypeScript client's dev
# packages, a Python venv with the Python client and pytest, moto for SQS and Tansu for Kafka), starts the local PostgreSQL if it
# is down, then runs the Rust tests (nextest, including the client conformance suite), the doc
# tests, both clients' own suites, and the API contract run (scripts/contract.sh). `.ci/run`
# runs this after fmt and clippy; it runs the docs check and the import-circle check itself.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian's Chromium and chromedriver (fonts-liberation gives the screenshots Arial-metric text).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  as_root apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq \
    chromium chromium-driver fonts-liberation >/dev/null
fi

# libfaketime: the cluster tests run servers whose clocks are skewed or jump.
if ! command -v faketime >/dev/null; then
  as_root apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq faketime >/dev/null
fi

# PostgreSQL: the PostgreSQL tests use the local server for real; start it if it is down.
if command -v pg_isready >/dev/null && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi

command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked

# The docs: the user guide builds (installing mdbook, pinned, when missing) and every relative
# link and anchor resolves. Then import circles among a crate's modules: none beyond the known
# ones, which may only shrink.
./scripts/check-docs.sh
python3 scripts/check-cycles.py

# Node (the TypeScript client and the client conformance suite): Debian's if missing.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  as_root apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null
fi
npm ci --prefix clients/typescript --no-audit --no-fund >/dev/null
# axe-core (pinned) for the dashboard test's accessibility check (WCAG 2 A/AA, both schemes).
npm ci --prefix crates/conveyor/tests/a11y --no-audit --no-fund >/dev/null

# The client suites drive the real server binary. The shipped binary (no `bench`) must build
# too: it is what the README runs.
cargo build -p conveyor
cargo build -p conveyor --features bench
# The facade's cargo features: an embedded build on SQLite alone (no server, PostgreSQL or CLI)
# must keep compiling.
cargo check -q -p conveyor --no-default-features --features sqlite

python3 -m venv target/py-venv
target/py-venv/bin/pip install -q 'moto[server]'  # moto_server: the sqs source's tests' SQS
# Tansu, an Apache Kafka-compatible broker from crates.io: the kafka source's tests start their
# own. `--locked` matters: its newest dependencies do not build together (~11 min, once).
command -v tansu >/dev/null || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/tansu" ] ||
  cargo install tansu --version 0.6.0 --locked --features dynostore
# `bench`: the benchmark and soak harness (`conveyor bench`) is tested too.
cargo nextest run --workspace --features conveyor/bench "$@"
cargo test --workspace --doc
npm test --prefix clients/typescript

# The Python client's own suite, in a venv under target/ (Debian's pip refuses system installs).
target/py-venv/bin/pip install -q -e 'clients/python[test]'
target/py-venv/bin/python -m pytest -q clients/python/tests

# The API document against a real server (schemathesis, pinned in the same venv): any
# disagreement between docs/openapi.yaml and the server fails the run. See docs/testing.md.
scripts/contract.sh
