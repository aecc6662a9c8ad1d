#!/usr/bin/env bash
# The test lanes CI does not run, each as one command (docs/testing.md, "The project's test lanes").
#
#   tests/lanes.sh unit                   the fast lane: tests/unit in one process
#   tests/lanes.sh rabbitmq [PATHS...]    integration and chaos suites with RabbitMQ as the broker
#                                         (a RabbitMQ at 127.0.0.1:5672 that rabbitmqctl reaches)
#   tests/lanes.sh cluster [PATHS...]     integration and chaos suites with the run state on a Redis
#                                         Cluster the session starts (3 primaries, a replica each)
#   tests/lanes.sh long [PATHS...]        the full-length runs (-m long, WESICHAIN_LONG=1): minutes
#
# PATHS (test files or node ids) replace the lane's default paths; options after `--` go to pytest
# as they are. Each lane prints the chaos suite's recovery times and the soak/backlog figures in
# its summary, where the docs' figures come from.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTEST=(.venv/bin/python -m pytest)
[ -x .venv/bin/python ] || PYTEST=(python3 -m pytest)

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

[ $# -ge 1 ] || usage
lane=$1
shift
paths=()
extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    extra=("$@")
    break
  fi
  paths+=("$1")
  shift
done

case "$lane" in
  unit)
    [ ${#paths[@]} -gt 0 ] || paths=(tests/unit)
    exec "${PYTEST[@]}" -n 0 "${paths[@]}" ${extra[@]+"${extra[@]}"}
    ;;
  rabbitmq)
    [ ${#paths[@]} -gt 0 ] || paths=(tests/integration tests/chaos)
    exec "${PYTEST[@]}" --broker rabbitmq -n 2 --dist loadfile "${paths[@]}" ${extra[@]+"${extra[@]}"}
    ;;
  cluster)
    [ ${#paths[@]} -gt 0 ] || paths=(tests/integration tests/chaos)
    exec "${PYTEST[@]}" --store cluster -n 2 --dist loadfile "${paths[@]}" ${extra[@]+"${extra[@]}"}
    ;;
  long)
    [ ${#paths[@]} -gt 0 ] || paths=(tests)
    WESICHAIN_LONG=1 exec "${PYTEST[@]}" -m long -n 0 "${paths[@]}" ${extra[@]+"${extra[@]}"}
    ;;
  *)
    usage
    ;;
esac
