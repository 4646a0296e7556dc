#!/usr/bin/env bash
# System packages the test suite uses, from Debian's archive (nothing downloaded from elsewhere):
#   chromium    headless browser for the viewer's end-to-end test (driven by Playwright)
#   bubblewrap  the code sandbox's preferred isolation backend (it falls back to `unshare -n`)
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
