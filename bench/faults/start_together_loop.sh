#!/usr/bin/env bash
# The 4-process barrier test (tests/search/test_start_together.py: SQLite and PostgreSQL) run
# ROUNDS times in a row (default 20) while two busy loops hold both cores; stops at the first
# failure and prints how many rounds passed in a row, with each round's seconds.
#
#     bash bench/faults/start_together_loop.sh [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
python=${PYTHON:-.venv/bin/python}
nice -n 19 "$python" -c "while True: pass" & busy1=$!
nice -n 19 "$python" -c "while True: pass" & busy2=$!
trap 'kill $busy1 $busy2 2>/dev/null' EXIT
passed=0
for i in $(seq 1 "$rounds"); do
  start=$(date +%s)
  if PYTHONPATH=$PWD "$python" -m pytest tests/search/test_start_together.py -x -q -p no:cacheprovider > /dev/null 2>&1; then
    passed=$((passed + 1)); echo "round $i passed ($(( $(date +%s) - start )) s), $passed in a row"
  else
    echo "round $i FAILED after $passed in a row (rerun: pytest tests/search/test_start_together.py -x)"; break
  fi
done
echo "$passed of $rounds rounds passed in a row (each: 4 processes on SQLite and on PostgreSQL)"
[ "$passed" -eq "$rounds" ]
