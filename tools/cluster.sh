#!/bin/sh
# cluster.sh: N `dflash serve` replicas on loopback ports behind HAProxy, on one machine.
#
#   tools/cluster.sh up N [--port P] [--dir D] [--affinity] [-- SERVE OPTIONS...]
#       HAProxy on 127.0.0.1:P (default 8080; its stats page on P+100: /stats, /stats;csv),
#       replica i on 127.0.0.1:P+i (i = 1..N); --affinity: consistent hashing on the
#       X-Conversation-Id header instead of leastconn. Each replica is started
#       as `build/dflash serve --host 127.0.0.1 --port P+i SERVE OPTIONS...` (no -m: the embedded
#       pair). Waits until every replica answers /health 200 and HAProxy answers, then returns.
#   tools/cluster.sh down [--dir D]            SIGTERM to every replica (they drain), then HAProxy;
#                                              SIGKILL for what is still there after 30 s.
#   tools/cluster.sh status [--dir D]          pid, port and /health of every process.
#   tools/cluster.sh restart I [--dir D]       start replica I again with its recorded command.
#   tools/cluster.sh kill I SIGNAL [--dir D]   send SIGNAL (TERM, KILL, ...) to replica I.
#
# Everything lives in one folder (default build/cluster, or $DFLASH_CLUSTER_DIR, or --dir):
# haproxy.cfg (rendered from deploy/haproxy/dflash.cfg), replica-I.pid / .log / .cmd, haproxy.pid
# / .log. `down` stops by pid only what `up` started. HAProxy is installed through
# tools/install-deps.sh when it is missing. docs/scaling.md describes the deployment.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DFLASH=${DFLASH:-$ROOT/build/dflash}
DIR=${DFLASH_CLUSTER_DIR:-$ROOT/build/cluster}
PORT=8080
AFFINITY=0

die() { echo "cluster: $*" >&2; exit 1; }

# health PORT PATH: prints the HTTP status of GET http://127.0.0.1:PORT/PATH (000 when no answer)
http_status() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1$2" 2>/dev/null || true; }

# a process that exited but is not reaped yet (a zombie: its new parent, pid 1, may reap late) is not alive
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != Z ]; }

start_replica() { # I
    i=$1
    [ -f "$DIR/replica-$i.cmd" ] || die "no replica $i in $DIR"
    # the command line is stored one argument per line (arguments may hold spaces)
    set --
    while IFS= read -r a; do set -- "$@" "$a"; done < "$DIR/replica-$i.cmd"
    "$@" >> "$DIR/replica-$i.log" 2>&1 &
    echo $! > "$DIR/replica-$i.pid"
}

wait_health() { # PORT PID SECONDS
    n=0
    while [ "$(http_status "$1" /health)" != 200 ]; do
        alive "$2" || return 1
        n=$((n + 1))
        [ $n -le $(($3 * 10)) ] || return 1
        sleep 0.1
    done
}

cmd_up() {
    N=$1; shift
    case $N in ''|*[!0-9]*) die "up: N must be a number of replicas (got '$N')";; esac
    [ "$N" -ge 1 ] && [ "$N" -le 64 ] || die "up: N must be 1..64 (got $N)"
    while [ $# -gt 0 ]; do
        case $1 in
            --port) [ $# -ge 2 ] || die "--port needs a value"; PORT=$2; shift 2;;
            --dir) [ $# -ge 2 ] || die "--dir needs a value"; DIR=$2; shift 2;;
            --affinity) AFFINITY=1; shift;;
            --) shift; break;;
            *) die "up: unknown option $1 (serve options go after --)";;
        esac
    done
    case $PORT in ''|*[!0-9]*) die "--port must be a number";; esac
    [ -x "$DFLASH" ] || die "$DFLASH not found: run make first"
    if ! command -v haproxy >/dev/null 2>&1; then
        echo "cluster: haproxy missing: installing it with tools/install-deps.sh"
        sh "$ROOT/tools/install-deps.sh" >/dev/null || die "could not install haproxy"
        command -v haproxy >/dev/null 2>&1 || die "haproxy still missing after tools/install-deps.sh"
    fi
    mkdir -p "$DIR"
    for f in "$DIR"/*.pid; do
        [ -f "$f" ] && alive "$(cat "$f")" && die "a cluster is already running in $DIR (tools/cluster.sh down first)"
    done
    rm -f "$DIR"/*.pid "$DIR"/*.log "$DIR"/*.cmd
    # the HAProxy configuration for these ports
    servers="" metrics=""
    i=1
    while [ $i -le "$N" ]; do
        p=$((PORT + i))
        servers="$servers    server r$i 127.0.0.1:$p check\n"
        metrics="$metrics    use-server r$i if { var(txn.replica) -m str r$i }\n"
        i=$((i + 1))
    done
    i=1
    while [ $i -le "$N" ]; do metrics="$metrics    server r$i 127.0.0.1:$((PORT + i))\n"; i=$((i + 1)); done
    awk -v servers="$servers" -v metrics="$metrics" -v port="$PORT" -v affinity="$AFFINITY" '
        /# BEGIN SERVERS/ { print; printf "%s", servers; skip = 1; next }
        /# BEGIN METRICS SERVERS/ { print; printf "%s", metrics; skip = 1; next }
        /# END/ { skip = 0 }
        /# STATS BIND/ { print "    bind 127.0.0.1:" (port + 100); next }
        /# BIND/ { print "    bind 127.0.0.1:" port; next }
        affinity && /^    balance leastconn/ { print "    balance hdr(X-Conversation-Id)"; print "    hash-type consistent"; next }
        !skip { print }' "$ROOT/deploy/haproxy/dflash.cfg" | sed 's/\\n/\n/g' > "$DIR/haproxy.cfg"
    haproxy -c -q -f "$DIR/haproxy.cfg" || die "the rendered $DIR/haproxy.cfg is not valid"
    # the replicas
    i=1
    while [ $i -le "$N" ]; do
        : > "$DIR/replica-$i.cmd"
        for a in "$DFLASH" serve --host 127.0.0.1 --port $((PORT + i)) "$@"; do printf '%s\n' "$a" >> "$DIR/replica-$i.cmd"; done
        start_replica $i
        i=$((i + 1))
    done
    i=1
    while [ $i -le "$N" ]; do
        if ! wait_health $((PORT + i)) "$(cat "$DIR/replica-$i.pid")" 60; then
            tail -5 "$DIR/replica-$i.log" >&2
            cmd_down
            die "replica $i (port $((PORT + i))) did not become healthy (it exited, or 60 s passed; log: $DIR/replica-$i.log)"
        fi
        i=$((i + 1))
    done
    haproxy -f "$DIR/haproxy.cfg" > "$DIR/haproxy.log" 2>&1 &
    echo $! > "$DIR/haproxy.pid"
    n=0
    while [ "$(http_status "$PORT" /health)" != 200 ]; do
        n=$((n + 1))
        if [ $n -gt 100 ] || ! alive "$(cat "$DIR/haproxy.pid")"; then
            tail -5 "$DIR/haproxy.log" >&2
            cmd_down
            die "haproxy did not answer on port $PORT"
        fi
        sleep 0.1
    done
    echo "$PORT" > "$DIR/port"
    echo "cluster: $N replica(s) on ports $((PORT + 1))..$((PORT + N)), haproxy on 127.0.0.1:$PORT (folder $DIR)"
}

cmd_down() {
    pids=""
    for f in "$DIR"/replica-*.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        if alive "$p"; then kill -TERM "$p" 2>/dev/null || true; pids="$pids $p"; fi
    done
    n=0
    for p in $pids; do
        while alive "$p" && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
        alive "$p" && { echo "cluster: replica pid $p still running after 30 s: SIGKILL" >&2; kill -KILL "$p" 2>/dev/null || true; }
    done
    if [ -f "$DIR/haproxy.pid" ]; then
        p=$(cat "$DIR/haproxy.pid")
        if alive "$p"; then
            kill -TERM "$p" 2>/dev/null || true
            n=0
            while alive "$p" && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
            alive "$p" && kill -KILL "$p" 2>/dev/null || true
        fi
    fi
    rm -f "$DIR"/*.pid
    echo "cluster: stopped (logs kept in $DIR)"
}

cmd_status() {
    [ -d "$DIR" ] || die "no cluster folder $DIR"
    port=$(cat "$DIR/port" 2>/dev/null || echo "?")
    rc=0
    if [ -f "$DIR/haproxy.pid" ] && alive "$(cat "$DIR/haproxy.pid")"; then
        echo "haproxy    pid $(cat "$DIR/haproxy.pid") port $port health $(http_status "$port" /health)"
        # the pool as HAProxy sees it: server, status (UP / DOWN / MAINT), retries, redispatches
        curl -s -m 2 "http://127.0.0.1:$((port + 100))/stats;csv" 2>/dev/null |
            awk -F, '$1 == "dflash_replicas" && $2 != "BACKEND" { printf "  pool %s %s (retries %s, redispatches %s)\n", $2, $18, $16, $17 }' || true
    else
        echo "haproxy    not running"; rc=1
    fi
    for f in "$DIR"/replica-*.cmd; do
        [ -f "$f" ] || continue
        i=$(basename "$f" .cmd); i=${i#replica-}
        rport=$(sed -n '6p' "$f")
        if [ -f "$DIR/replica-$i.pid" ] && alive "$(cat "$DIR/replica-$i.pid")"; then
            echo "replica $i  pid $(cat "$DIR/replica-$i.pid") port $rport health $(http_status "$rport" /health)"
        else
            echo "replica $i  not running (port $rport)"; rc=1
        fi
    done
    return $rc
}

[ $# -ge 1 ] || die "usage: tools/cluster.sh up N [--port P] [--dir D] [-- serve options] | down | status | restart I | kill I SIGNAL"
cmd=$1; shift
# --dir may follow any command
case $cmd in
    up) [ $# -ge 1 ] || die "up needs N"; cmd_up "$@";;
    down|status)
        while [ $# -gt 0 ]; do case $1 in --dir) DIR=$2; shift 2;; *) die "$cmd: unknown option $1";; esac; done
        "cmd_$cmd";;
    restart)
        [ $# -ge 1 ] || die "restart needs a replica number"; i=$1; shift
        while [ $# -gt 0 ]; do case $1 in --dir) DIR=$2; shift 2;; *) die "restart: unknown option $1";; esac; done
        [ -f "$DIR/replica-$i.pid" ] && alive "$(cat "$DIR/replica-$i.pid")" && die "replica $i is running"
        start_replica "$i"
        wait_health "$(sed -n '6p' "$DIR/replica-$i.cmd")" "$(cat "$DIR/replica-$i.pid")" 60 || die "replica $i did not become healthy"
        echo "cluster: replica $i restarted";;
    kill)
        [ $# -ge 2 ] || die "kill needs a replica number and a signal"; i=$1; sig=$2; shift 2
        while [ $# -gt 0 ]; do case $1 in --dir) DIR=$2; shift 2;; *) die "kill: unknown option $1";; esac; done
        [ -f "$DIR/replica-$i.pid" ] || die "no replica $i"
        kill -"$sig" "$(cat "$DIR/replica-$i.pid")";;
    *) die "unknown command $cmd";;
esac
