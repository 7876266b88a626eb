#!/usr/bin/env bash
# The cluster path of `logbuf analyze`, end to end on this machine:
#   1. a Spark standalone master and one worker on 127.0.0.1, from pyspark's own jars (bin/spark-class)
#   2. the analysis submitted to it in client mode:
#        spark-submit --master spark://127.0.0.1:PORT --deploy-mode client src/logbuf/pipeline/job.py REC OUT
#   3. master and worker stopped by their PIDs (also on failure or Ctrl-C)
# Usage: scripts/spark-standalone-check.sh [RECORDING OUT [ANALYZE OPTIONS...]]
#   without arguments a small scenario is generated in a temp dir first; options after OUT go to the job
#   (e.g. --no-plots).
# Environment: PYTHON (default .venv/bin/python, created by ./run setup when missing), SPARK_MASTER_PORT
#   (default 7077), CHECK_TIMEOUT_S (default 300: the submitted job), START_TIMEOUT_S (default 180: each daemon).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${SPARK_MASTER_PORT:-7077}
TIMEOUT_S=${CHECK_TIMEOUT_S:-300}
START_S=${START_TIMEOUT_S:-180}
if [ -z "${PYTHON:-}" ] && [ ! -x "$ROOT/.venv/bin/python" ]; then
    echo "standalone-check: no .venv yet: running ./run setup first" >&2
    (cd "$ROOT" && ./run setup) >&2
fi
PY=${PYTHON:-$ROOT/.venv/bin/python}
"$PY" -c 'import pyspark' 2>/dev/null || {
    echo "standalone-check: $PY has no pyspark (install the analytics extra: pip install -e '.[analytics]')" >&2
    exit 2
}

JAVA_HOME=$("$ROOT/scripts/ensure-java.sh")
SPARK_HOME=$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
export JAVA_HOME SPARK_HOME
export PYSPARK_PYTHON=$PY PYSPARK_DRIVER_PYTHON=$PY SPARK_LOCAL_IP=127.0.0.1
export SPARK_NO_DAEMONIZE=1 SPARK_LOG_DIR=${SPARK_LOG_DIR:-} PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/logbuf-standalone.XXXXXX")
MASTER_PID="" WORKER_PID=""
cleanup() {
    local status=$?
    for pid in $WORKER_PID $MASTER_PID; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    if [ "$status" -ne 0 ]; then
        echo "standalone-check: failed; master and worker logs:" >&2
        tail -n 30 "$WORK/master.log" "$WORK/worker.log" >&2 2>/dev/null || true
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT INT TERM

wait_for_port() {  # bounded poll, 0.25 s apart
    local deadline=$((SECONDS + $2))
    until "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.5).close()" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "standalone-check: nothing listens on port $1 after $2 s" >&2; return 1; }
        kill -0 "$3" 2>/dev/null || { echo "standalone-check: process $3 exited" >&2; return 1; }
        sleep 0.25
    done
}

if [ $# -ge 2 ]; then
    RECORDING=$1 OUT=$2
    shift 2
else
    RECORDING=$WORK/recording OUT=$WORK/out
    "$PY" -m logbuf.cli scenario "$RECORDING" --messages 20000 --quiet
fi

# -Dspark.ui... keep the daemons' web UIs on ephemeral ports (nothing else must take 8080/8081)
"$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$PORT" --webui-port 0 >"$WORK/master.log" 2>&1 &
MASTER_PID=$!
wait_for_port "$PORT" "$START_S" "$MASTER_PID"
echo "standalone-check: master pid $MASTER_PID on spark://127.0.0.1:$PORT" >&2

"$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    --host 127.0.0.1 --cores 2 --memory 2g --webui-port 0 --work-dir "$WORK/worker" \
    "spark://127.0.0.1:$PORT" >"$WORK/worker.log" 2>&1 &
WORKER_PID=$!
echo "standalone-check: worker pid $WORKER_PID" >&2

LOG4J=$("$PY" -c "from logbuf.pipeline.spark import write_log4j_config as w; print(w('$WORK/log4j2.properties'))")
QUIET="-Dlog4j2.configurationFile=file:$LOG4J"
timeout "$TIMEOUT_S" "$SPARK_HOME/bin/spark-submit" \
    --master "spark://127.0.0.1:$PORT" --deploy-mode client \
    --driver-memory 1g --executor-memory 1g --total-executor-cores 2 \
    --driver-java-options "$QUIET" --conf spark.executor.extraJavaOptions="$QUIET" \
    --conf spark.ui.enabled=false --conf spark.pyspark.python="$PY" --conf spark.pyspark.driver.python="$PY" \
    "$ROOT/src/logbuf/pipeline/job.py" "$RECORDING" "$OUT" --quiet "$@"

test -s "$OUT/report.md" && test -s "$OUT/summary.json"
"$PY" - "$OUT/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"standalone-check: ok - session {s['session']}, {s['sequences']} sequences, "
      f"{s['freezes']} freeze(s), {s['gaps_both']} gap(s) on both feeds, p50 delay "
      f"{s['delay']['percentiles_ns'].get('p50')} ns", file=sys.stderr)
PYEOF
if [ "$RECORDING" = "$WORK/recording" ]; then
    echo "standalone-check: report was $OUT/report.md (removed with the temp dir)" >&2
fi
