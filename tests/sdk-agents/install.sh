#!/usr/bin/env bash
# Installs the dependencies of the SDK test agents in this directory, and the
# real agents of ../real-agents:
#   node_modules/       from package.json + package-lock.json (npm ci)
#   .venv/              a python3 venv with requirements.txt
#   ../real-agents/node_modules/
#                       qwen serve (@qwen-code/qwen-code), from its package.json
#                       + package-lock.json (the lock must not change)
#
# Usage: tests/sdk-agents/install.sh [--force]     (from any cwd)
#
# Idempotent and fast when already installed: each part writes a stamp (hash of
# its inputs) as its last step and is skipped while the stamp matches. Safe to
# run concurrently: installers serialize on an flock, and node_modules is built
# in a temp dir and renamed into place. Exits non-zero with a message when
# node/npm/python3 are missing or an install step fails.
set -euo pipefail

src="${BASH_SOURCE[0]}"
[[ $src == */* ]] || src="./$src"
DIR="$(cd "${src%/*}" && pwd)"
REAL="$(cd "$DIR/../real-agents" && pwd)"
FORCE=0
case "${1:-}" in
  --force) FORCE=1 ;;
  "") ;;
  -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
  *) echo "install.sh: unknown argument: $1 (use --force or nothing)" >&2; exit 2 ;;
esac

say() { echo "sdk-agents/install.sh: $*"; }
die() { echo "sdk-agents/install.sh: error: $*" >&2; exit 1; }

missing=()
for tool in node npm python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  die "required tool(s) not found on PATH: ${missing[*]} (node+npm for node-agent.mjs, python3 with the venv module for python_agent.py)"
fi

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

VENV_STAMP_FILE="$DIR/.venv/.acp-gateway-install-stamp"

# The stamp of a node_modules in $1, and the one its inputs make.
node_stamp_file() { echo "$1/node_modules/.acp-gateway-install-stamp"; }
node_stamp() { hash_of "$1/package.json" "$1/package-lock.json"; }
venv_stamp() {
  # The venv links to the interpreter it was made with: rebuild if python3 changes.
  local py
  py="$(python3 -c 'import sys, os; print(os.path.realpath(sys.executable), sys.version)')"
  { cat "$DIR/requirements.txt"; echo "$py"; } | sha256sum | cut -d' ' -f1
}

node_ok() {
  local stamp
  stamp="$(node_stamp_file "$1")"
  [[ $FORCE == 0 && -f $stamp && "$(cat "$stamp")" == "$(node_stamp "$1")" ]]
}
venv_ok() { [[ $FORCE == 0 && -f $VENV_STAMP_FILE && -x $DIR/.venv/bin/python && "$(cat "$VENV_STAMP_FILE")" == "$(venv_stamp)" ]]; }

# Fast path, without the lock: stamps are written last, so a matching stamp
# means a finished install.
if node_ok "$DIR" && node_ok "$REAL" && venv_ok; then
  say "already installed (node_modules, .venv and real-agents/node_modules up to date)"
  exit 0
fi

# Serialize installers (several test binaries may call us at once).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$DIR/.install.lock"
  if ! flock -n 9; then
    say "another install is running; waiting for it"
    flock 9
  fi
else
  say "warning: flock not found; concurrent installs are not serialized"
fi

# npm ci in $1 (a directory with package.json + package-lock.json); with
# $2 = install, `npm install` on the same lock, which must come out unchanged:
# qwen's clipboard package names binaries for other platforms that the
# registry does not serve, which npm install skips as the optional packages
# they are but npm ci refuses as missing from the lock.
install_node() {
  local dir="$1" how="${2:-ci}" name
  name="$(basename "$dir")/node_modules"
  if node_ok "$dir"; then
    say "$name up to date (npm ci skipped)"
    return
  fi
  say "installing $name with npm $how ($(node --version), npm $(npm --version 2>/dev/null))"
  local tmp
  tmp="$(mktemp -d "$dir/.install-tmp.XXXXXX")"
  cp "$dir/package.json" "$dir/package-lock.json" "$tmp/"
  if ! (cd "$tmp" && npm "$how" --no-audit --no-fund --loglevel=error) >&2; then
    rm -rf "$tmp"
    die "npm $how in $dir failed (see output above)"
  fi
  if ! cmp -s "$dir/package-lock.json" "$tmp/package-lock.json"; then
    rm -rf "$tmp"
    die "npm $how in $dir changed package-lock.json: it is out of date with package.json (update it with npm install there)"
  fi
  node_stamp "$dir" >"$(node_stamp_file "$tmp")"
  # Swap into place: move the old tree aside first (rename is atomic), then drop it.
  if [[ -e $dir/node_modules ]]; then
    mv "$dir/node_modules" "$tmp/node_modules.old"
  fi
  mv "$tmp/node_modules" "$dir/node_modules"
  rm -rf "$tmp"
  say "$name installed"
}

install_venv() {
  if venv_ok; then
    say ".venv up to date (pip install skipped)"
    return
  fi
  python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 ($(command -v python3)) lacks the venv/ensurepip modules (on Debian: apt-get install python3-venv)"
  say "creating .venv with $(python3 --version 2>&1) and installing requirements.txt"
  rm -rf "$DIR/.venv"
  python3 -m venv "$DIR/.venv" >&2 || die "python3 -m venv failed"
  if ! "$DIR/.venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --no-input -r "$DIR/requirements.txt" >&2; then
    die "pip install -r requirements.txt failed (see output above)"
  fi
  "$DIR/.venv/bin/python" -c 'import acp, http_ece, jwt, cryptography' || die "the venv cannot import acp, http_ece, jwt and cryptography after install"
  venv_stamp >"$VENV_STAMP_FILE"
  say ".venv installed"
}

install_node "$DIR"
install_venv
install_node "$REAL" install
"$REAL/node_modules/.bin/qwen" --version >/dev/null 2>&1 \
  || die "qwen (installed in $REAL/node_modules) does not run: $REAL/node_modules/.bin/qwen --version fails"
say "done: node $DIR/node-agent.mjs | $DIR/.venv/bin/python $DIR/python_agent.py | $REAL/node_modules/.bin/qwen serve"
