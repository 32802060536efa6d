#!/bin/sh
# Stands in for ssh so that Open MPI launches the daemon of a second "node" on this machine
# (mpirun --mca plm_rsh_agent test/fake_ssh.sh --hostfile H, H naming two hosts): Open MPI runs
# "ssh [options] HOST COMMAND", and this runs COMMAND here. test/test_ranks.sh uses it.
while [ $# -gt 0 ]; do
    case "$1" in
    -*) shift ;;
    *) break ;;
    esac
done
shift
exec /bin/sh -c "$*"
