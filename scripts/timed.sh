#!/usr/bin/env bash
# Run a command and print how long it took, whatever its outcome: `make test` prints each part's
# time this way. Usage: scripts/timed.sh NAME COMMAND [ARG...]; exits with COMMAND's status.
name=$1
shift
start=$(date +%s%N)
status=0
"$@" || status=$?
tenths=$((($(date +%s%N) - start) / 100000000))
printf '== %s: %d.%d s (exit %d)\n' "$name" $((tenths / 10)) $((tenths % 10)) "$status"
exit "$status"
