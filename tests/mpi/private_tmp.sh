#!/usr/bin/env bash
# Usage: private_tmp.sh COMMAND [ARGS...]
#
# Runs COMMAND (mpirun, or a test that starts mpirun) with temp folders of its own, so that
# two copies of the suite can run MPI side by side. Left alone, every mpirun on the machine
# keeps its session directory (its PMIx stores, contact file and hardware map) under
# /tmp/ompi.HOST.UID, one folder for all of them, and the ranks' shared-memory segments in
# /dev/shm under a name with 16 bits of the job's id. Here:
#   - TMPDIR is a folder made for this run (mktemp -d: a name no other run has): mpirun's
#     session directory, PMIx's system folder and the tests' own temp files go there;
#   - the shared-memory segments go to a folder made for this run in /dev/shm (memory, as
#     before), or in the run's temp folder where /dev/shm cannot be written;
#   - ATTN_MPI_TEST_SCRATCH names that same folder, for the files a test writes and reads at
#     once many times (the training tests' checkpoint at every step: in memory they cost no
#     disk sync).
# Both are removed when COMMAND ends; its exit status is this script's.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/attn_mpi.XXXXXX") || { echo "private_tmp.sh: cannot make a temp folder"; exit 1; }
shm=$(mktemp -d /dev/shm/attn_mpi.XXXXXX 2>/dev/null) || shm=$tmp
trap 'rm -rf "$tmp" "$shm"' EXIT
export TMPDIR=$tmp OMPI_MCA_btl_vader_backing_directory=$shm ATTN_MPI_TEST_SCRATCH=$shm
"$@"
