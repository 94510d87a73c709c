# shellcheck shell=bash
# scripts/lib/ha.sh - a private highly available PostgreSQL: one etcd member
# and three PostgreSQL 15 nodes managed by Patroni, on loopback.
#
# Sourced by scripts/ha (after scripts/lib/stack.sh). Everything lives in one
# directory HA_DIR:
#   ha.env            ports, the scope and DATABASE_URL (source it)
#   pgpass            the superuser's password for libpq (mode 600)
#   etcd/             etcd's data (owned by etcd), etcd.log, etcd.pid
#   pgN/              node N: pgN.yml, data/, Patroni's log patroni.log,
#                     patroni.pid (owned by postgres)
# Each daemon runs as its own unprivileged user, started as
#   setsid sh -c 'echo $$ >PIDFILE; exec setpriv --reuid=U ... DAEMON'
# so that the pid file holds the daemon's own pid (runuser forks).
# Functions return non-zero on failure and never exit the caller.

HA_NODES=(pg1 pg2 pg3)
HA_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}

# ha_as USER CMD...: run CMD as USER (as is when not root).
ha_as() {
	local user=$1
	shift
	if stack_is_root; then
		setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
	else
		"$@"
	fi
}

# ha_spawn USER PIDFILE LOG CMD...: start CMD as USER in its own session,
# stdout and stderr to LOG; PIDFILE (written by root) holds CMD's pid.
ha_spawn() {
	local user=$1 pidfile=$2 log=$3
	shift 3
	local -a pre=()
	stack_is_root && pre=(setpriv --reuid="$user" --regid="$user" --init-groups --)
	# shellcheck disable=SC2016 # $$ is the inner shell's pid
	setsid sh -c 'p=$1; shift; echo $$ >"$p"; exec "$@"' sh "$pidfile" "${pre[@]}" "$@" \
		</dev/null >>"$log" 2>&1 &
	disown $! 2>/dev/null || true
	local tenths=50
	until [[ -s $pidfile ]]; do
		((tenths-- > 0)) || return 1
		sleep 0.1
	done
}

# ha_pick_ports: choose free, distinct loopback ports for etcd and the nodes.
ha_pick_ports() {
	local -A seen=()
	local -a got=()
	local p
	while ((${#got[@]} < 8)); do
		p=$(stack_free_port) || return 1
		[[ -n ${seen[$p]:-} ]] && continue
		seen[$p]=1
		got+=("$p")
	done
	HA_ETCD_PORT=${got[0]} HA_ETCD_PEER=${got[1]}
	HA_PG_PORTS=("${got[2]}" "${got[3]}" "${got[4]}")
	HA_API_PORTS=("${got[5]}" "${got[6]}" "${got[7]}")
}

ha_secret() {
	head -c 18 /dev/urandom | base64 | tr '+/' 'xy'
}

# ha_load DIR: read DIR/ha.env (written by ha_init).
ha_load() {
	HA_DIR=$1
	[[ -r $HA_DIR/ha.env ]] || return 1
	# shellcheck disable=SC1091
	source "$HA_DIR/ha.env"
	read -r -a HA_PG_PORTS <<<"$HA_PG_PORT_LIST"
	read -r -a HA_API_PORTS <<<"$HA_API_PORT_LIST"
}

# ha_dsn: the multi-host connection string that finds the writable primary.
ha_dsn() {
	local IFS=,
	printf 'host=127.0.0.1,127.0.0.1,127.0.0.1 port=%s dbname=idemflow user=postgres' \
		"${HA_PG_PORTS[*]}"
	printf ' passfile=%s target_session_attrs=read-write connect_timeout=2' \
		"$(stack_conninfo_value "$HA_DIR/pgpass")"
}

# ha_node_dsn N [DB]: a connection string to node N (0-based) only.
ha_node_dsn() {
	printf 'host=127.0.0.1 port=%s dbname=%s user=postgres passfile=%s connect_timeout=2' \
		"${HA_PG_PORTS[$1]}" "${2:-idemflow}" "$(stack_conninfo_value "$HA_DIR/pgpass")"
}

# _ha_yaml N: node N's Patroni configuration on stdout.
_ha_yaml() {
	local n=$1 name=${HA_NODES[$1]} sync=true
	((HA_SYNC)) || sync=false
	cat <<EOF
# written by scripts/ha
scope: $HA_SCOPE
name: $name
log:
  level: INFO
restapi:
  listen: 127.0.0.1:${HA_API_PORTS[$n]}
  connect_address: 127.0.0.1:${HA_API_PORTS[$n]}
etcd3:
  hosts: 127.0.0.1:$HA_ETCD_PORT
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    primary_start_timeout: 0
    synchronous_mode: $sync
    synchronous_mode_strict: $sync
    synchronous_node_count: 1
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: 'on'
        synchronous_commit: 'on'
        wal_retrieve_retry_interval: 500ms
        max_connections: 200
  initdb:
  - encoding: UTF8
  - locale: C.UTF-8
  - data-checksums
postgresql:
  listen: 127.0.0.1:${HA_PG_PORTS[$n]}
  connect_address: 127.0.0.1:${HA_PG_PORTS[$n]}
  data_dir: $HA_DIR/$name/data
  bin_dir: $HA_BINDIR
  pgpass: $HA_DIR/$name/pgpass.patroni
  parameters:
    unix_socket_directories: '$HA_DIR/$name'
  authentication:
    superuser:
      username: postgres
      password: '$HA_PW_SUPER'
    replication:
      username: replicator
      password: '$HA_PW_REPL'
    rewind:
      username: rewinder
      password: '$HA_PW_REWIND'
  pg_hba:
  - local all all peer
  - host replication replicator 127.0.0.1/32 scram-sha-256
  - host all all 127.0.0.1/32 scram-sha-256
EOF
}

# ha_init DIR SYNC(1|0): a new cluster's directory, ports and configuration.
ha_init() {
	local n name
	HA_DIR=$1 HA_SYNC=$2
	stack_install_dir postgres "$HA_DIR" 755 || return 1
	ha_pick_ports || return 1
	HA_SCOPE=idemflow-$(printf '%s' "$HA_DIR" | sha256sum | cut -c1-8)
	HA_PW_SUPER=$(ha_secret) HA_PW_REPL=$(ha_secret) HA_PW_REWIND=$(ha_secret)
	(umask 077 && printf '127.0.0.1:*:*:postgres:%s\n' "$HA_PW_SUPER" >"$HA_DIR/pgpass")
	stack_install_dir etcd "$HA_DIR/etcd" 700 || return 1
	for n in 0 1 2; do
		name=${HA_NODES[$n]}
		stack_install_dir postgres "$HA_DIR/$name" 700 || return 1
		(umask 077 && _ha_yaml "$n" >"$HA_DIR/$name/$name.yml")
		stack_is_root && chown postgres:postgres "$HA_DIR/$name/$name.yml"
	done
	{
		echo "# written by scripts/ha: the cluster in $HA_DIR"
		echo "HA_SCOPE=$HA_SCOPE"
		echo "HA_SYNC=$HA_SYNC"
		echo "HA_ETCD_PORT=$HA_ETCD_PORT"
		echo "HA_ETCD_PEER=$HA_ETCD_PEER"
		echo "HA_PG_PORT_LIST='${HA_PG_PORTS[*]}'"
		echo "HA_API_PORT_LIST='${HA_API_PORTS[*]}'"
	} >"$HA_DIR/ha.env"
	printf 'DATABASE_URL=%s\n' "$(printf '%q' "$(ha_dsn)")" >>"$HA_DIR/ha.env"
}

# ha_etcd_start: the one etcd member, as the etcd user.
ha_etcd_start() {
	local url=http://127.0.0.1:$HA_ETCD_PORT peer=http://127.0.0.1:$HA_ETCD_PEER tenths=200
	local -a state=(--initial-cluster-state new)
	rm -f -- "$HA_DIR/etcd.pid"
	ha_spawn etcd "$HA_DIR/etcd.pid" "$HA_DIR/etcd.log" /usr/bin/etcd --name ha \
		--data-dir "$HA_DIR/etcd/data" --listen-client-urls "$url" --advertise-client-urls "$url" \
		--listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
		--initial-cluster "ha=$peer" "${state[@]}" || return 1
	until ETCDCTL_API=3 etcdctl --endpoints="$url" --dial-timeout=1s endpoint health \
		>/dev/null 2>&1; do
		if ! stack_alive "$(stack_pid_from "$HA_DIR/etcd.pid")" || ((tenths-- <= 0)); then
			stack_log "etcd did not become healthy on $url"
			stack_tail "$HA_DIR/etcd.log"
			return 1
		fi
		sleep 0.1
	done
}

# ha_node_start N: node N's Patroni (which starts its PostgreSQL), as postgres.
ha_node_start() {
	local name=${HA_NODES[$1]}
	local log=$HA_DIR/$name/patroni.log
	if [[ ! -e $log ]]; then
		: >"$log"
		stack_is_root && chown postgres:postgres "$log"
	fi
	rm -f -- "$HA_DIR/$name.pid"
	ha_spawn postgres "$HA_DIR/$name.pid" "$log" /usr/bin/patroni "$HA_DIR/$name/$name.yml"
}

# ha_patronictl ARGS...: patronictl against this cluster.
ha_patronictl() {
	patronictl -c "$HA_DIR/pg1/pg1.yml" "$@"
}

# ha_members: one line per member, "name role state lag port" (from patronictl).
ha_members() {
	ha_patronictl list -f json 2>/dev/null | python3 -c '
import json, sys
for m in json.load(sys.stdin):
    print(m.get("Member"), m.get("Role", "").replace(" ", "_"), m.get("State"),
          m.get("Lag in MB", 0) if m.get("Lag in MB", 0) != "" else 0, m.get("Port"))'
}

# ha_wait_healthy SECONDS [SYNC]: wait for a running Leader and, with sync on,
# a streaming Sync Standby (else a Replica); all three members running.
ha_wait_healthy() {
	local tenths=$(($1 * 10)) want=${2:-$HA_SYNC} m
	while :; do
		m=$(ha_members) || m=
		if [[ $(grep -c ' \(running\|streaming\) ' <<<"$m") == 3 ]] &&
			grep -q '^[^ ]* Leader running ' <<<"$m"; then
			if ((want)); then
				grep -q '^[^ ]* Sync_Standby \(running\|streaming\) ' <<<"$m" && return 0
			else
				grep -q '^[^ ]* \(Replica\|Sync_Standby\) ' <<<"$m" && return 0
			fi
		fi
		(((tenths -= 5) > 0)) || return 1
		sleep 0.5
	done
}

# ha_leader: print the leader's node index (0-based).
ha_leader() {
	local name
	name=$(ha_members | awk '$2 == "Leader" { print $1; exit }')
	case $name in
	pg1) echo 0 ;; pg2) echo 1 ;; pg3) echo 2 ;;
	*) return 1 ;;
	esac
}

# ha_postmaster N: the pid of node N's postmaster, if it runs.
ha_postmaster() {
	local pid
	pid=$(stack_pid_from "$HA_DIR/${HA_NODES[$1]}/data/postmaster.pid") || return 1
	stack_alive "$pid" && echo "$pid"
}

# ha_stop: stop the three Patronis (each stops its PostgreSQL), then etcd.
ha_stop() {
	local n pid pm
	local -a pids=() pms=()
	for n in 0 1 2; do
		pid=$(stack_pid_from "$HA_DIR/${HA_NODES[$n]}.pid") && stack_alive "$pid" &&
			_ha_is "$pid" patroni && pids+=("$pid")
		pm=$(ha_postmaster "$n") && pms+=("$pm")
	done
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		if ! stack_wait_gone "$pid" 40; then
			stack_log "patroni $pid ignored SIGTERM: killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	# A postmaster whose Patroni was killed keeps running: stop it by its pid.
	for n in 0 1 2; do
		pm=$(ha_postmaster "$n") || continue
		_ha_is "$pm" postgres || continue
		kill -INT "$pm" 2>/dev/null || true
		if ! stack_wait_gone "$pm" 20; then
			stack_log "postmaster $pm did not stop: killing it"
			stack_kill_children "$pm" KILL
			kill -KILL "$pm" 2>/dev/null || true
		fi
	done
	for n in 0 1 2; do
		rm -f -- "$HA_DIR/${HA_NODES[$n]}.pid"
	done
	pid=$(stack_pid_from "$HA_DIR/etcd.pid") && stack_alive "$pid" && _ha_is "$pid" etcd && {
		kill -TERM "$pid" 2>/dev/null || true
		stack_wait_gone "$pid" 20 || kill -KILL "$pid" 2>/dev/null || true
	}
	rm -f -- "$HA_DIR/etcd.pid"
	return 0
}

# _ha_is PID WORD: PID's command line mentions WORD (a pid file may be stale).
_ha_is() {
	local cmd
	cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
	[[ $cmd == *"$2"* ]]
}

# ha_running: true when any daemon of HA_DIR still runs.
ha_running() {
	local f pid
	for f in "$HA_DIR"/etcd.pid "$HA_DIR"/pg[123].pid; do
		pid=$(stack_pid_from "$f") && stack_alive "$pid" && return 0
	done
	return 1
}

# ha_start DIR SYNC SECONDS: initialise DIR (first time), start etcd and the
# three nodes, wait for Leader + Sync Standby, create database idemflow.
ha_start() {
	local dir=$1 sync=$2 secs=${3:-90} n
	if [[ -r $dir/ha.env ]]; then
		ha_load "$dir" || return 1
		# Old ports may have been taken since: etcd and Patroni keep them,
		# so a cluster is restarted on its ports or not at all.
		for n in "$HA_ETCD_PORT" "$HA_ETCD_PEER" "${HA_PG_PORTS[@]}" "${HA_API_PORTS[@]}"; do
			if stack_port_open "$n"; then
				stack_log "port $n of the cluster in $dir is taken: scripts/ha clean, then start"
				return 1
			fi
		done
	else
		ha_init "$dir" "$sync" || return 1
	fi
	ha_etcd_start || return 1
	for n in 0 1 2; do
		ha_node_start "$n" || { stack_log "patroni ${HA_NODES[$n]} did not start"; return 1; }
	done
	if ! ha_wait_healthy "$secs"; then
		stack_log "no Leader and Sync Standby within ${secs}s"
		ha_patronictl list >&2 || true
		for n in 0 1 2; do stack_tail "$HA_DIR/${HA_NODES[$n]}/patroni.log" 20; done
		return 1
	fi
	ha_createdb
}

# ha_createdb: database idemflow on the primary (once).
ha_createdb() {
	local dsn have
	dsn=$(ha_dsn)
	dsn=${dsn/dbname=idemflow/dbname=postgres}
	have=$("$HA_BINDIR/psql" -XAtq -d "$dsn" \
		-c "SELECT 1 FROM pg_database WHERE datname = 'idemflow'") || return 1
	[[ $have == 1 ]] && return 0
	"$HA_BINDIR/psql" -XAtq -d "$dsn" -c 'CREATE DATABASE idemflow' >/dev/null
}
