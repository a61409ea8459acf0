#!/usr/bin/env bash
# N replicas of `specula serve` (the default model) behind nginx on loopback, and Prometheus with
# --prometheus (docs/deploy.md). Prints the front URL; Ctrl-C stops everything it started.
#
# Usage: scripts/cluster.sh N [--port 8080] [--prometheus] [-- SERVE_ARGS...]
#   replicas listen on PORT+1 .. PORT+N, nginx on PORT, Prometheus (with --prometheus) on PORT+100.
#   SERVE_ARGS go to every replica (default: the main job's, scripts/main_job.args).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${SPECULA_BUILD:-$ROOT/build}
N=${1:-}
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] || { echo "usage: $0 N [--port 8080] [--prometheus] [-- SERVE_ARGS...]" >&2; exit 2; }
shift
PORT=8080; PROM=0; read -ra SERVE_ARGS < scripts/main_job.args
while [ $# -gt 0 ]; do
  case $1 in
    --port) PORT=$2; shift ;;
    --prometheus) PROM=1 ;;
    --) shift; SERVE_ARGS=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "nginx is missing: apt-get install nginx-light (scripts/setup.sh --tests installs it)" >&2; exit 1; }
[ -x "$BUILD/specula" ] || bash scripts/setup.sh >&2

RUN=$(mktemp -d /tmp/specula-cluster.XXXXXX)
PIDS=()
stop() {
  trap - INT TERM EXIT
  echo "stopping ${#PIDS[@]} processes" >&2
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUN"
}
trap stop INT TERM EXIT

wait_healthy() {  # URL
  for _ in $(seq 1 600); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1 did not answer" >&2; return 1
}

SERVERS=""
for i in $(seq 1 "$N"); do
  p=$((PORT + i))
  "$BUILD/specula" serve --port "$p" "${SERVE_ARGS[@]}" > "$RUN/replica$i.log" 2>&1 &
  PIDS+=($!)
  SERVERS+="    server 127.0.0.1:$p max_fails=2 fail_timeout=1s;"$'\n'
done
for i in $(seq 1 "$N"); do wait_healthy "http://127.0.0.1:$((PORT + i))/health"; done

sed -e "s|@LISTEN@|127.0.0.1:$PORT|" -e "s|@RUN@|$RUN|g" deploy/nginx/specula.conf.in |
  awk -v servers="$SERVERS" '{ if ($0 == "@SERVERS@") printf "%s", servers; else print }' > "$RUN/nginx.conf"
"$NGINX" -p "$RUN" -c "$RUN/nginx.conf" -g 'daemon off;' > "$RUN/nginx.out" 2>&1 &
PIDS+=($!)
wait_healthy "http://127.0.0.1:$PORT/health"

if [ $PROM -eq 1 ]; then
  targets=$(for i in $(seq 1 "$N"); do printf '"127.0.0.1:%d", ' $((PORT + i)); done)
  sed "s|@TARGETS@|${targets%, }|" deploy/prometheus/prometheus.yml.in > "$RUN/prometheus.yml"
  cp deploy/prometheus/specula_rules.yml "$RUN/"
  prometheus --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/tsdb" \
    --web.listen-address="127.0.0.1:$((PORT + 100))" > "$RUN/prometheus.log" 2>&1 &
  PIDS+=($!)
  wait_healthy "http://127.0.0.1:$((PORT + 100))/-/ready"
  echo "Prometheus: http://127.0.0.1:$((PORT + 100))/"
fi
echo "front (nginx, $N replicas): http://127.0.0.1:$PORT/   logs in $RUN; Ctrl-C stops everything"
wait
