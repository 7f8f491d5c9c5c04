#!/usr/bin/env bash
# Install the Debian packages the test suite needs (a real OpenSSH server for the SFTP tests,
# hdf5-tools for h5ls, headless Chromium and its WebDriver for the console's browser tests). Only missing packages are installed; it needs root for that.
set -euo pipefail
need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v sftp >/dev/null 2>&1 || need+=(openssh-client)
command -v h5ls >/dev/null 2>&1 || need+=(hdf5-tools)
command -v flock >/dev/null 2>&1 || need+=(util-linux)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)  # page text
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system_deps: missing Debian packages: ${need[*]} (run 'make test' as root, or apt-get install them)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "system_deps: installed ${need[*]}"
