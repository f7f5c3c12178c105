#!/bin/sh
# Runs the 6-rank "rank 3 SIGKILLed mid all-reduce" job many times and
# prints how often gorun's final line named rank 3 with its signal and
# counted the other five as collateral or stopped.
#   scripts/culprit-stress.sh [runs]   (default 20)
set -eu
cd "$(dirname "$0")/.."
GORUN_CULPRIT_RUNS="${1:-20}" go test -count=1 -v -run '^TestCulpritNamedAfterSIGKILL$' ./launcher |
	grep -E 'want rank 3|named right|^(ok|FAIL)'
