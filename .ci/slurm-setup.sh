#!/usr/bin/env bash
# CI: install Debian's slurm-wlm and munge and start a single-node SLURM on this
# machine (ckptaudit/cluster/: munged, slurmctld, slurmd; returns when sinfo
# shows the node idle), so that the `slurm` tests run against a real cluster.
# Needs root (or sudo) and apt.  CKPTAUDIT_CI_SLURM=0 skips it (the SLURM tests
# then start the cluster themselves, or skip when slurm-wlm is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CKPTAUDIT_CI_SLURM:-1}" = "0" ]; then
  echo "ci: CKPTAUDIT_CI_SLURM=0: not setting up SLURM"
  exit 0
fi
t0=$(date +%s)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "ci: SLURM setup needs root or sudo" >&2; exit 1; }
  SUDO="sudo"
fi
if ! { [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v sinfo >/dev/null; }; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
t1=$(date +%s)
# ckptaudit.cluster is stdlib only: the system python3 runs it before any venv exists.
$SUDO python3 -m ckptaudit.cluster start
echo "ci: single-node SLURM ready: install $((t1 - t0)) s, start $(($(date +%s) - t1)) s"
