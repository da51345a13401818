#!/usr/bin/env bash
# A Redis for kvtier's remote tier: its tests, the examples, or trying it out. Loopback only,
# with a password, its files under one directory; never the machine's own Redis service.
#
#   scripts/redis.sh start      # a standalone server on 127.0.0.1:$KVTIER_REDIS_PORT (6390)
#   scripts/redis.sh stop
#   scripts/redis.sh status     # one line (running on 127.0.0.1:PORT, pid, or not
#                               # running); exit 0 when it answers
#   scripts/redis.sh env        # export lines: KVTIER_REDIS_URL, KVTIER_REDIS_PASSWORD,
#                               # KVTIER_AUTH_KEY_FILE
#   scripts/redis.sh cluster    # a 3-master Redis Cluster on 127.0.0.1:$KVTIER_REDIS_CLUSTER_PORT
#                               # and the two ports after it (7390-7392)
#   scripts/redis.sh cluster-stop
#   scripts/redis.sh tls        # a TLS-only server on 127.0.0.1:$KVTIER_REDIS_TLS_PORT (6392),
#                               # its certificate signed by a CA made in $KVTIER_REDIS_DIR/tls
#   scripts/redis.sh tls-stop
#
# Installs Debian's redis-server package when redis-server is missing (as root, or with
# sudo); exits 3 with the reason when it cannot. The password is made once (random) and kept
# in $KVTIER_REDIS_DIR/password (0600); KVTIER_REDIS_MAXMEMORY (default 256mb) bounds the
# server, which then evicts least recently used keys (allkeys-lru), as a shared cache should.
# Beside the password, $KVTIER_REDIS_DIR/auth.key (0600, 32 random bytes as hex, made once)
# is the key that authenticates kvtier's values (a tier's auth_key_file): whoever can write
# the server cannot forge blocks without it. A real fleet makes its own with
# `kvtier keys new PATH` and gives it to its nodes only.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${KVTIER_REDIS_DIR:-"$root/.services/redis"}
port=${KVTIER_REDIS_PORT:-6390}
cluster_base=${KVTIER_REDIS_CLUSTER_PORT:-7390}
cluster_ports=("$cluster_base" $((cluster_base + 1)) $((cluster_base + 2)))
maxmemory=${KVTIER_REDIS_MAXMEMORY:-256mb}
tls_port=${KVTIER_REDIS_TLS_PORT:-6392}

say() { echo "redis.sh: $*" >&2; }

ensure_installed() {
    if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
        return 0
    fi
    local apt=()
    if [ "$(id -u)" = 0 ]; then
        apt=(apt-get)
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        apt=(sudo -n apt-get)
    else
        say "redis-server is not installed and this user cannot install it (not root, no sudo): install Debian's redis-server package"
        exit 3
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        say "redis-server is not installed and this machine has no apt-get: install Redis >= 6"
        exit 3
    fi
    say "installing Debian's redis-server package"
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q redis-server >&2; then
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" update -q >&2 || true
        if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q redis-server >&2; then
            say "could not install redis-server with apt-get"
            exit 3
        fi
    fi
}

password() {
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [ ! -s "$dir/password" ]; then
        (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/password")
    fi
    cat "$dir/password"
}

auth_key() { # the path of the values' key file, made once (never printed)
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [ ! -s "$dir/auth.key" ]; then
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/auth.key")
    fi
    echo "$dir/auth.key"
}

cli() { # cli PORT ARGS...: redis-cli against a server of ours
    local p=$1
    shift
    local tls=()
    if [ "$p" = "$tls_port" ]; then
        tls=(--tls --cacert "$dir/tls/ca.crt")
    fi
    REDISCLI_AUTH=$(password) redis-cli -h 127.0.0.1 -p "$p" "${tls[@]}" "$@"
}

make_certificates() {
    local tls=$dir/tls
    [ -s "$tls/server.crt" ] && return 0
    command -v openssl >/dev/null 2>&1 || {
        say "openssl is needed to make the TLS certificates"
        exit 3
    }
    mkdir -p "$tls"
    chmod 700 "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=kvtier test CA" \
        -keyout "$tls/ca.key" -out "$tls/ca.crt" >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$tls/server.key" -out "$tls/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$tls/san.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" \
        -CAcreateserial -days 3650 -extfile "$tls/san.ext" -out "$tls/server.crt" >/dev/null 2>&1
}

write_config() { # write_config NAME PORT [cluster|tls]
    local name=$1 p=$2 mode=${3:-}
    mkdir -p "$dir/$name"
    {
        echo "bind 127.0.0.1 -::1"
        echo "protected-mode yes"
        if [ "$mode" = tls ]; then
            echo "port 0"
            echo "tls-port $p"
            echo "tls-cert-file $dir/tls/server.crt"
            echo "tls-key-file $dir/tls/server.key"
            echo "tls-ca-cert-file $dir/tls/ca.crt"
            echo "tls-auth-clients no"
        else
            echo "port $p"
        fi
        echo "requirepass $(password)"
        echo "masterauth $(password)"
        echo "daemonize yes"
        echo "pidfile $dir/$name/redis.pid"
        echo "logfile $dir/$name/redis.log"
        echo "dir $dir/$name"
        echo "save \"\""
        echo "appendonly no"
        echo "maxmemory $maxmemory"
        echo "maxmemory-policy allkeys-lru"
        if [ "$mode" = cluster ]; then
            echo "cluster-enabled yes"
            echo "cluster-config-file $dir/$name/nodes.conf"
            echo "cluster-node-timeout 2000"
        fi
    } >"$dir/$name/redis.conf"
    chmod 600 "$dir/$name/redis.conf"
}

start_one() { # start_one NAME PORT [cluster]
    local name=$1 p=$2
    if cli "$p" ping >/dev/null 2>&1; then
        return 0
    fi
    write_config "$@"
    redis-server "$dir/$name/redis.conf"
    for _ in $(seq 100); do
        if cli "$p" ping >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.05
    done
    say "redis-server on port $p did not answer; see $dir/$name/redis.log"
    exit 1
}

stop_one() { # stop_one NAME PORT
    local name=$1 p=$2
    cli "$p" shutdown nosave >/dev/null 2>&1 || true
    if [ -f "$dir/$name/redis.pid" ]; then
        kill "$(cat "$dir/$name/redis.pid")" 2>/dev/null || true
        rm -f "$dir/$name/redis.pid"
    fi
}

case "${1:-}" in
start)
    ensure_installed
    start_one standalone "$port"
    say "running on 127.0.0.1:$port (password in $dir/password, values' key in $(auth_key))"
    ;;
stop)
    stop_one standalone "$port"
    ;;
status)
    # One line on stdout; exit 0 only when the server answers.
    if ! command -v redis-cli >/dev/null 2>&1; then
        echo "not running on 127.0.0.1:$port (redis-cli is not installed)"
        exit 1
    fi
    if ! cli "$port" ping >/dev/null 2>&1; then
        echo "not running on 127.0.0.1:$port"
        exit 1
    fi
    pid=$(cli "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
    echo "running on 127.0.0.1:$port, pid ${pid:-unknown} (files in $dir)"
    ;;
env)
    echo "export KVTIER_REDIS_URL=redis://127.0.0.1:$port/0"
    echo "export KVTIER_REDIS_PASSWORD=$(password)"
    echo "export KVTIER_AUTH_KEY_FILE=$(auth_key)"
    echo "export KVTIER_REDIS_TLS_URL=rediss://127.0.0.1:$tls_port/0"
    echo "export KVTIER_REDIS_TLS_CA=$dir/tls/ca.crt"
    echo "export KVTIER_REDIS_CLUSTER_NODES=$(printf '127.0.0.1:%s,' "${cluster_ports[@]}" | sed 's/,$//')"
    ;;
cluster)
    ensure_installed
    for p in "${cluster_ports[@]}"; do
        start_one "cluster-$p" "$p" cluster
    done
    if ! cli "${cluster_ports[0]}" cluster info 2>/dev/null | grep -q "cluster_state:ok"; then
        nodes=()
        for p in "${cluster_ports[@]}"; do nodes+=("127.0.0.1:$p"); done
        REDISCLI_AUTH=$(password) redis-cli --cluster create "${nodes[@]}" \
            --cluster-replicas 0 --cluster-yes >&2
    fi
    # Every node, not only the first, must see all slots served before a client writes:
    # a node that has not heard the others yet answers CLUSTERDOWN (a failed store).
    for p in "${cluster_ports[@]}"; do
        for _ in $(seq 300); do
            cli "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" && break
            sleep 0.1
        done
        if ! cli "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok"; then
            say "cluster node 127.0.0.1:$p is not ok after 30 s; see $dir/cluster-$p/redis.log"
            exit 1
        fi
    done
    say "cluster running on 127.0.0.1:${cluster_ports[*]}"
    ;;
cluster-stop)
    for p in "${cluster_ports[@]}"; do
        stop_one "cluster-$p" "$p"
        rm -f "$dir/cluster-$p/nodes.conf"
    done
    ;;
tls)
    ensure_installed
    make_certificates
    start_one tls "$tls_port" tls
    say "TLS server running on 127.0.0.1:$tls_port (CA: $dir/tls/ca.crt)"
    ;;
tls-stop)
    stop_one tls "$tls_port"
    ;;
*)
    echo "usage: scripts/redis.sh start|stop|status|env|cluster|cluster-stop|tls|tls-stop" >&2
    exit 2
    ;;
esac
