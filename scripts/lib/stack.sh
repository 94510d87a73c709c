# shellcheck shell=bash
# scripts/lib/stack.sh - start and stop a private idemflow stack.
#
# Sourced by scripts/run (a local stack for trying the service by hand) and by
# t/run-test (a throwaway stack per test). It starts, on loopback only:
#   - a private PostgreSQL cluster     stack_pg_start DIR [fast] / stack_pg_stop
#   - N partitions behind a PL/Proxy   stack_shards_start DIR N CLI [fast] / stack_shards_stop DIR
#     proxy, all migrated
#     or a throwaway one, migrated     stack_scratch_start NAME [CLI] / stack_scratch_stop
#   - the FastCGI server idemflow-fcgi stack_fcgi_start CONF SOCK PIDFILE LOG / stack_fcgi_stop
#   - nginx in a private prefix        stack_nginx_start DIR PORT SOCK TEMPLATE / stack_nginx_stop
#   - a private RabbitMQ node          stack_rabbit_start DIR / stack_rabbit_stop [RDIR]
#   - a private NATS server, JetStream stack_nats_start DIR / stack_nats_stop [NDIR]
#
# PostgreSQL refuses to run as root: as root its commands run as the Debian
# `postgres` user (runuser), so DIR must be traversable by that user; nginx
# workers then run as www-data and need to reach the FastCGI socket; RabbitMQ
# runs as the `rabbitmq` user, NATS as the `nats` user.
# Functions return non-zero on failure and never exit the caller.

STACK_LOG_PREFIX=${STACK_LOG_PREFIX:-stack}

stack_log() {
	printf '%s: %s\n' "$STACK_LOG_PREFIX" "$*" >&2
}

stack_is_root() {
	[[ $EUID -eq 0 ]]
}

# stack_tail FILE [N]: print the last N lines of FILE to stderr, headed by its name.
stack_tail() {
	local file=$1 n=${2:-50}
	[[ -s $file ]] || return 0
	printf -- '----- last %s lines of %s -----\n' "$n" "$file" >&2
	tail -n "$n" -- "$file" >&2 || true
}

# stack_free_port [PORT...]: print a TCP port that is free on 127.0.0.1 right
# now and is none of PORT: the probe closes its socket, so two calls in a row
# may name the same port, and a caller that needs several passes the ones it
# has.
stack_free_port() {
	local port _
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		if command -v python3 >/dev/null 2>&1; then
			port=$(python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()') || return 1
		else
			port=$((20000 + RANDOM % 30000))
			stack_port_open "$port" && continue
		fi
		[[ " $* " == *" $port "* ]] && continue
		echo "$port"
		return 0
	done
	return 1
}

# stack_port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
stack_port_open() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# stack_alive PID: true while PID runs (a zombie, exited but not yet reaped
# by its parent, counts as gone).
stack_alive() {
	local stat
	kill -0 "$1" 2>/dev/null || return 1
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	stat=${stat##*) }
	[[ ${stat%% *} != Z ]]
}

# stack_wait_gone PID SECONDS: wait until PID has exited; false on timeout.
stack_wait_gone() {
	local pid=$1 tenths=$(($2 * 10))
	while stack_alive "$pid"; do
		((tenths-- > 0)) || return 1
		sleep 0.1
	done
	return 0
}

# stack_pid_from FILE: print the pid stored in the first line of FILE, if any.
stack_pid_from() {
	local pid=
	[[ -r $1 ]] && read -r pid 2>/dev/null <"$1"
	[[ $pid =~ ^[0-9]+$ ]] && echo "$pid"
}

# stack_kill_children PID SIGNAL: signal the direct children of PID.
stack_kill_children() {
	local child
	for child in $(pgrep -P "$1" 2>/dev/null); do
		kill "-$2" "$child" 2>/dev/null || true
	done
}

# stack_sweep DIR: SIGKILL any process whose command line mentions DIR.
# A last resort for throwaway directories (mktemp names), after orderly stops.
stack_sweep() {
	local dir=$1 proc pid cmd
	[[ -n $dir && $dir != / ]] || return 0
	for proc in /proc/[0-9]*; do
		pid=${proc#/proc/}
		[[ $pid == "$$" || $pid == "${BASHPID:-}" ]] && continue
		cmd=$(tr '\0' ' ' 2>/dev/null <"$proc/cmdline") || continue
		if [[ $cmd == *"$dir"* ]]; then
			stack_log "killing leftover process $pid: $cmd"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
}

# ---------------------------------------------------------------- PostgreSQL

# stack_as_pg CMD...: run CMD as the PostgreSQL owner (postgres when root).
stack_as_pg() {
	if stack_is_root; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# stack_fcgi_dir DIR: DIR will hold the idemflow-fcgi socket, made with
# listen_mode 0660 (never world-writable). nginx's workers must still
# connect: when root they run as www-data, so DIR gets group www-data and
# the setgid bit, and the socket made in it inherits the group. Otherwise
# nginx runs as the same user as idemflow-fcgi and needs nothing.
stack_fcgi_dir() {
	if stack_is_root; then
		chgrp www-data -- "$1" && chmod g+s -- "$1"
	fi
}

# stack_install_dir USER DIR MODE: create DIR owned by USER when root (the
# servers run as their own users then), by the caller otherwise.
stack_install_dir() {
	if stack_is_root; then
		install -d -o "$1" -g "$1" -m "$3" -- "$2"
	else
		install -d -m "$3" -- "$2"
	fi
}

# stack_pg_install_dir DIR MODE: create DIR owned by the PostgreSQL owner.
stack_pg_install_dir() {
	stack_install_dir postgres "$1" "$2"
}

# stack_pg_bindir: print the directory holding initdb and pg_ctl.
stack_pg_bindir() {
	local dir
	if [[ -n ${PG_BINDIR:-} ]]; then
		echo "$PG_BINDIR"
		return 0
	fi
	dir=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null |
		sort -V | tail -n 1)
	if [[ -n $dir ]]; then
		dirname -- "$dir"
	elif command -v initdb >/dev/null 2>&1; then
		dirname -- "$(command -v initdb)"
	else
		stack_log "PostgreSQL server binaries not found (install the postgresql package)"
		return 1
	fi
}

# stack_conninfo_value VALUE: quote VALUE for a libpq conninfo string if needed.
stack_conninfo_value() {
	local v=$1
	if [[ $v =~ [[:space:]\'\\] || -z $v ]]; then
		v=${v//\\/\\\\}
		v=${v//\'/\\\'}
		v="'$v'"
	fi
	printf '%s' "$v"
}

_stack_pg_initdb() {
	local fast=$1 out=$STACK_PG_DIR/initdb.log
	# trust only until the first start: _stack_pg_write_hba replaces it.
	local -a args=(-D "$STACK_PG_DATA" -U postgres -A trust --no-locale -E UTF8 --no-instructions)
	[[ $fast == fast ]] && args+=(--no-sync)
	if ! stack_as_pg "$STACK_PG_BINDIR/initdb" "${args[@]}" >"$out" 2>&1; then
		stack_log "initdb failed"
		stack_tail "$out"
		return 1
	fi
	printf "\n# per-start settings written by scripts/lib/stack.sh\ninclude_if_exists 'stack.conf'\n" \
		>>"$STACK_PG_DATA/postgresql.conf"
}

# _stack_pg_write_conf fast|"": settings re-written at every start (port may change).
_stack_pg_write_conf() {
	local sock=${STACK_PG_SOCKDIR//\'/\'\'}
	{
		echo "listen_addresses = '127.0.0.1'"
		echo "port = $STACK_PG_PORT"
		echo "unix_socket_directories = '$sock'"
		echo "max_connections = 100"
		if [[ $1 == fast ]]; then
			echo "# throwaway cluster: durability is not needed"
			echo "fsync = off"
			echo "synchronous_commit = off"
			echo "full_page_writes = off"
			echo "# tests read the rows a statement sent (t/e2e/test_stores.c)"
			echo "shared_preload_libraries = 'pg_stat_statements'"
		fi
	} >"$STACK_PG_DATA/stack.conf"
	chmod 644 "$STACK_PG_DATA/stack.conf"
	_stack_pg_write_hba || return 1
}

# _stack_pg_write_hba: who may connect, re-written at every start (an older
# cluster trusted every local user). The superuser postgres: over the socket
# only the stack's owner (the invoking user, and postgres when root), by
# peer; over TCP with the password in $STACK_PG_DIR/pgpass (mode 0600,
# exported as PGPASSFILE). Any other role by its password. Nobody else on
# the host gets in.
_stack_pg_write_hba() {
	local owner
	owner=$(id -un) || return 1
	{
		echo "# written by scripts/lib/stack.sh: the stack's owner only"
		echo "local all         postgres                peer map=stack"
		echo "local replication postgres                peer map=stack"
		echo "local all         all                     scram-sha-256"
		echo "host  all         all       127.0.0.1/32  scram-sha-256"
		echo "host  replication postgres  127.0.0.1/32  scram-sha-256"
	} >"$STACK_PG_DATA/pg_hba.conf" || return 1
	{
		echo "stack $owner postgres"
		[[ $owner == postgres ]] || echo "stack postgres postgres"
	} >"$STACK_PG_DATA/pg_ident.conf" || return 1
	chmod 600 "$STACK_PG_DATA/pg_hba.conf" "$STACK_PG_DATA/pg_ident.conf"
	stack_is_root && chown postgres:postgres "$STACK_PG_DATA/pg_hba.conf" \
		"$STACK_PG_DATA/pg_ident.conf"
	if [[ ! -s $STACK_PG_DIR/pgpass ]]; then
		(umask 077 && printf '*:*:*:postgres:%s\n' "$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')" \
			>"$STACK_PG_DIR/pgpass") || return 1
	fi
}

# _stack_pg_password: give postgres the password of $STACK_PG_DIR/pgpass
# (over the socket, by peer).
_stack_pg_password() {
	local pw
	pw=$(cut -d: -f5- -- "$STACK_PG_DIR/pgpass") || return 1
	printf "SET log_statement = 'none'; ALTER ROLE postgres PASSWORD '%s';\n" "$pw" |
		"$STACK_PG_BINDIR/psql" -h "$STACK_PG_SOCKDIR" -p "$STACK_PG_PORT" -U postgres \
			-d postgres -XAtq -v ON_ERROR_STOP=1 >/dev/null
}

_stack_pg_createdb() {
	local -a conn=(-h "$STACK_PG_SOCKDIR" -p "$STACK_PG_PORT" -U postgres)
	local have
	have=$("$STACK_PG_BINDIR/psql" "${conn[@]}" -d postgres -XAtq \
		-c "SELECT 1 FROM pg_database WHERE datname = 'idemflow'") || return 1
	[[ $have == 1 ]] && return 0
	"$STACK_PG_BINDIR/createdb" "${conn[@]}" idemflow
}

# stack_pg_start DIR [fast]: start (initialising if needed) a private cluster
# with data in DIR/pg, socket in DIR/pgsock, log DIR/pg.log, on a free
# 127.0.0.1 port, with a database idemflow. "fast" turns durability off (tests).
# Exports DATABASE_URL and the PG* variables; sets STACK_PG_* for stack_pg_stop.
stack_pg_start() {
	local dir=$1 mode=${2:-} try
	STACK_PG_DIR=$dir
	STACK_PG_DATA=$dir/pg
	STACK_PG_SOCKDIR=$dir/pgsock
	STACK_PG_LOG=$dir/pg.log
	STACK_PG_BINDIR=$(stack_pg_bindir) || return 1
	stack_pg_install_dir "$STACK_PG_DATA" 700 || return 1
	stack_pg_install_dir "$STACK_PG_SOCKDIR" 755 || return 1
	if [[ ! -e $STACK_PG_LOG ]]; then
		: >"$STACK_PG_LOG"
		stack_is_root && chown postgres:postgres "$STACK_PG_LOG"
	fi
	if [[ ! -f $STACK_PG_DATA/PG_VERSION ]]; then
		_stack_pg_initdb "$mode" || return 1
	fi
	for try in 1 2 3; do
		STACK_PG_PORT=$(stack_free_port) || return 1
		_stack_pg_write_conf "$mode"
		if stack_as_pg "$STACK_PG_BINDIR/pg_ctl" -D "$STACK_PG_DATA" -l "$STACK_PG_LOG" \
			-w -t 60 start >/dev/null; then
			_stack_pg_password || { stack_tail "$STACK_PG_LOG"; return 1; }
			_stack_pg_createdb || { stack_tail "$STACK_PG_LOG"; return 1; }
			_stack_pg_export
			return 0
		fi
		stack_log "PostgreSQL did not start on port $STACK_PG_PORT (attempt $try)"
	done
	stack_tail "$STACK_PG_LOG"
	return 1
}

_stack_pg_export() {
	export PGHOST=$STACK_PG_SOCKDIR PGPORT=$STACK_PG_PORT PGUSER=postgres PGDATABASE=idemflow
	export PGPASSFILE=$STACK_PG_DIR/pgpass
	DATABASE_URL="host=$(stack_conninfo_value "$STACK_PG_SOCKDIR") port=$STACK_PG_PORT"
	DATABASE_URL+=" dbname=idemflow user=postgres"
	export DATABASE_URL
}

# stack_pg_running [DATA]: true when the cluster in DATA is up.
stack_pg_running() {
	local data=${1:-${STACK_PG_DATA:-}}
	[[ -n $data && -f $data/postmaster.pid ]] || return 1
	local bindir
	bindir=${STACK_PG_BINDIR:-$(stack_pg_bindir)} || return 1
	stack_as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1
}

# stack_pg_stop [DATA]: stop the cluster (fast, then immediate, then SIGKILL).
stack_pg_stop() {
	local data=${1:-${STACK_PG_DATA:-}} bindir pid
	[[ -n $data && -f $data/postmaster.pid ]] || return 0
	bindir=${STACK_PG_BINDIR:-$(stack_pg_bindir)} || return 1
	stack_as_pg "$bindir/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1 && return 0
	stack_as_pg "$bindir/pg_ctl" -D "$data" -m immediate -w -t 10 stop >/dev/null 2>&1 && return 0
	pid=$(stack_pid_from "$data/postmaster.pid") || return 0
	stack_log "PostgreSQL $pid did not stop: killing it"
	stack_kill_children "$pid" KILL
	kill -KILL "$pid" 2>/dev/null || true
	stack_wait_gone "$pid" 5
}

# stack_scratch_start NAME [CLI]: a throwaway PostgreSQL for a script that
# starts its own: a directory /tmp/idemflow-NAME.XXXXXX (STACK_SCRATCH), a
# fast cluster in it (stack_pg_start, which exports DATABASE_URL) and, when
# CLI (an idemflow binary) is given, its database built by "CLI migrate".
# The caller traps EXIT with stack_scratch_stop, which removes it all.
stack_scratch_start() {
	STACK_SCRATCH=$(mktemp -d "/tmp/idemflow-$1.XXXXXX") || return 1
	chmod 755 "$STACK_SCRATCH"
	stack_pg_start "$STACK_SCRATCH" fast || return 1
	[[ -z ${2:-} ]] || "$2" --db "$DATABASE_URL" migrate >/dev/null || return 1
}

# stack_scratch_stop: stop and remove what stack_scratch_start made.
stack_scratch_stop() {
	[[ -n ${STACK_SCRATCH:-} ]] || return 0
	stack_pg_stop "$STACK_SCRATCH/pg" >/dev/null 2>&1 || true
	stack_sweep "$STACK_SCRATCH"
	rm -rf -- "$STACK_SCRATCH"
	STACK_SCRATCH=
}

# ------------------------------------------------------- partitions and proxy

# stack_shards_start DIR N CLI [fast]: N (a power of two) partitions, each
# a private cluster as stack_pg_start makes it (DIR/p0, DIR/p1, ...),
# migrated by "CLI migrate" and given its range of ids
# (idemflow_partition_ids), and a proxy cluster (DIR/proxy) migrated by
# "CLI migrate --proxy", whose foreign server idemflow_partitions names the
# partitions (over their sockets, as the clusters' superuser, which the
# proxy's backends are by peer authentication). Exports DATABASE_URL (the
# proxy, what the workers connect to) and the PG* variables of the proxy;
# sets STACK_SHARD_URL[i], STACK_SHARD_DATA[i], STACK_SHARD_DIR[i] (its
# stack_pg_start DIR: pgsock/, pg.log, pgpass) and STACK_SHARD_PORT[i] for
# each partition, and STACK_SHARD_PROXY_URL.
# Tenants and tokens are created on their partition with CLI, then
# registered with stack_shards_sync.
stack_shards_start() {
	local dir=$1 n=$2 cli=$3 mode=${4:-} i opts=''
	if ((n < 1 || (n & (n - 1)) != 0)); then
		stack_log "partitions: $n is not a power of two (PL/Proxy needs one)"
		return 1
	fi
	# Read by the caller (scripts/run, t/shards).
	# shellcheck disable=SC2034
	STACK_SHARD_URL=() STACK_SHARD_DATA=() STACK_SHARD_DIR=() STACK_SHARD_PORT=() STACK_SHARD_N=$n
	for ((i = 0; i < n; i++)); do
		install -d -m 755 -- "$dir/p$i" || return 1
		stack_pg_start "$dir/p$i" "$mode" || return 1
		# shellcheck disable=SC2034
		STACK_SHARD_URL[i]=$DATABASE_URL STACK_SHARD_DATA[i]=$STACK_PG_DATA
		# shellcheck disable=SC2034
		STACK_SHARD_DIR[i]=$STACK_PG_DIR STACK_SHARD_PORT[i]=$STACK_PG_PORT
		"$cli" --db "$DATABASE_URL" migrate >/dev/null || return 1
		"$STACK_PG_BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
			-c "SELECT idemflow_partition_ids($i)" >/dev/null || return 1
		opts+="${opts:+, }p$i '${DATABASE_URL//\'/\'\'}'"
	done
	install -d -m 755 -- "$dir/proxy" || return 1
	stack_pg_start "$dir/proxy" "$mode" || return 1
	# shellcheck disable=SC2034
	STACK_SHARD_PROXY_DATA=$STACK_PG_DATA STACK_SHARD_PROXY_URL=$DATABASE_URL
	"$cli" --db "$DATABASE_URL" migrate --proxy >/dev/null || return 1
	"$STACK_PG_BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" >/dev/null <<EOT || return 1
SET client_min_messages = warning;
DROP SERVER IF EXISTS idemflow_partitions CASCADE;
CREATE SERVER idemflow_partitions FOREIGN DATA WRAPPER plproxy OPTIONS ($opts);
CREATE USER MAPPING FOR PUBLIC SERVER idemflow_partitions;
EOT
}

# stack_shards_sync: register the partitions' tenants and tokens in the
# proxy's directory ($DATABASE_URL, idemflow_directory_sync).
stack_shards_sync() {
	"$(stack_pg_bindir)/psql" -XAtq -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
		-c "SELECT idemflow_directory_sync()" >/dev/null
}

# stack_shards_env I: export DATABASE_URL and the PG* variables of
# partition I (of the last stack_shards_start), as stack_pg_start exports
# them for a cluster of its own: for a client of that partition alone (a
# dispatcher, the CLI, a test's SQL).
stack_shards_env() {
	local i=$1
	[[ -n ${STACK_SHARD_URL[i]:-} ]] || { stack_log "no partition $i"; return 1; }
	export PGHOST=${STACK_SHARD_DIR[i]}/pgsock PGPORT=${STACK_SHARD_PORT[i]} PGUSER=postgres
	export PGDATABASE=idemflow PGPASSFILE=${STACK_SHARD_DIR[i]}/pgpass
	export DATABASE_URL=${STACK_SHARD_URL[i]}
}

# stack_shards_stop DIR: stop the proxy and every partition under DIR.
stack_shards_stop() {
	local dir=$1 d
	for d in "$dir"/proxy "$dir"/p[0-9]*; do
		[[ -d $d/pg ]] && stack_pg_stop "$d/pg"
	done
	return 0
}

# ------------------------------------------------------------------- FastCGI

# stack_fcgi_start CONF SOCKET PIDFILE LOG: run "$IDEMFLOW_FCGI" --config CONF in
# the background, in its own process group, stderr to LOG; wait up to 10s for
# SOCKET and PIDFILE. Sets STACK_FCGI_PID (= process group) and STACK_FCGI_PIDFILE.
stack_fcgi_start() {
	local conf=$1 sock=$2 pidfile=$3 log=$4 tenths=100
	: "${IDEMFLOW_FCGI:?IDEMFLOW_FCGI is not set}"
	[[ -x $IDEMFLOW_FCGI ]] || { stack_log "not executable: $IDEMFLOW_FCGI"; return 1; }
	rm -f -- "$pidfile"
	STACK_FCGI_PIDFILE=$pidfile
	setsid "$IDEMFLOW_FCGI" --config "$conf" </dev/null >>"$log" 2>&1 &
	STACK_FCGI_PID=$!
	# Not a job of the caller: no "Killed" notice when a test kills it.
	disown "$STACK_FCGI_PID"
	echo "$STACK_FCGI_PID" >"$pidfile.pgid"
	until [[ -S $sock && -s $pidfile ]]; do
		if ! stack_alive "$STACK_FCGI_PID"; then
			stack_log "idemflow-fcgi exited during startup"
			stack_tail "$log"
			return 1
		fi
		if ((tenths-- <= 0)); then
			stack_log "idemflow-fcgi did not create $sock and $pidfile within 10s"
			stack_tail "$log"
			return 1
		fi
		sleep 0.1
	done
}

_stack_is_fcgi() {
	local cmd
	cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
	[[ $cmd == *idemflow* ]]
}

# stack_fcgi_stop [PIDFILE]: SIGTERM the supervisor (from PIDFILE and the pid we
# started), wait up to ${STACK_FCGI_STOP_TIMEOUT:-30}s, then SIGKILL its whole
# process group so no worker is left behind.
stack_fcgi_stop() {
	local pidfile=${1:-${STACK_FCGI_PIDFILE:-}} pid pgid='' pids=()
	[[ -n $pidfile ]] || return 0
	pgid=${STACK_FCGI_PID:-$(stack_pid_from "$pidfile.pgid")} || true
	# The pid file may be stale (pid reused): only signal an idemflow process.
	pid=$(stack_pid_from "$pidfile") && _stack_is_fcgi "$pid" && pids+=("$pid")
	[[ -n $pgid && $pgid != "${pid:-}" ]] && pids+=("$pgid")
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || continue
		if ! stack_wait_gone "$pid" "${STACK_FCGI_STOP_TIMEOUT:-30}"; then
			stack_log "idemflow-fcgi $pid ignored SIGTERM: killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	if [[ -n $pgid ]] && kill -0 -- "-$pgid" 2>/dev/null; then
		kill -KILL -- "-$pgid" 2>/dev/null || true
	fi
	rm -f -- "$pidfile.pgid"
	unset STACK_FCGI_PID
	return 0
}

# --------------------------------------------------------------------- nginx

stack_sed_escape() {
	printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'
}

# stack_nginx_bin: print the nginx binary (/usr/sbin is not on every PATH).
stack_nginx_bin() {
	if [[ -n ${NGINX:-} ]]; then
		echo "$NGINX"
	elif command -v nginx 2>/dev/null; then
		:
	elif [[ -x /usr/sbin/nginx ]]; then
		echo /usr/sbin/nginx
	else
		stack_log "nginx not found (install the nginx package)"
		return 1
	fi
}

# stack_nginx_render TEMPLATE OUT PREFIX PORT SOCKET [METRICS_PORT]: fill in
# the template.
stack_nginx_render() {
	local template=$1 out=$2 user_line='# user: nginx runs as the invoking user'
	stack_is_root && user_line='user www-data;'
	sed -e "s|@PREFIX@|$(stack_sed_escape "$3")|g" \
		-e "s|@PORT@|$(stack_sed_escape "$4")|g" \
		-e "s|@SOCKET@|$(stack_sed_escape "$5")|g" \
		-e "s|@METRICS_PORT@|$(stack_sed_escape "${6:-}")|g" \
		-e "s|@USER_LINE@|$(stack_sed_escape "$user_line")|g" \
		-- "$template" >"$out"
}

# stack_nginx_start DIR PORT SOCKET TEMPLATE: run nginx with prefix DIR/nginx on
# 127.0.0.1:PORT in front of unix:SOCKET. An empty PORT picks a free one
# (retried on a clash). GET /metrics by address is on a port of its own,
# always a free one. Sets STACK_NGINX_PREFIX, STACK_NGINX_PORT and
# STACK_NGINX_METRICS_PORT.
stack_nginx_start() {
	local dir=$1 port=$2 sock=$3 template=$4 prefix try tenths nginx
	nginx=$(stack_nginx_bin) || return 1
	prefix=$dir/nginx
	STACK_NGINX_PREFIX=$prefix
	install -d -m 755 -- "$prefix" "$prefix/tmp" || return 1
	for try in 1 2 3; do
		STACK_NGINX_PORT=${port:-$(stack_free_port)} || return 1
		STACK_NGINX_METRICS_PORT=$(stack_free_port "$STACK_NGINX_PORT") || return 1
		stack_nginx_render "$template" "$prefix/nginx.conf" "$prefix" "$STACK_NGINX_PORT" "$sock" \
			"$STACK_NGINX_METRICS_PORT" || return 1
		if "$nginx" -p "$prefix/" -c nginx.conf -e "$prefix/error.log" 2>"$prefix/start.err"; then
			tenths=100
			until stack_port_open "$STACK_NGINX_PORT"; do
				if ((tenths-- <= 0)); then
					stack_log "nginx does not answer on 127.0.0.1:$STACK_NGINX_PORT"
					stack_tail "$prefix/error.log"
					return 1
				fi
				sleep 0.1
			done
			return 0
		fi
		# Only a port taken between stack_free_port and bind() is worth a retry.
		if ! grep -q 'Address already in use' "$prefix/start.err" ||
			{ [[ -n $port ]] && grep -q "127.0.0.1:$port failed" "$prefix/start.err"; }; then
			break
		fi
		stack_log "nginx could not bind port $STACK_NGINX_PORT (attempt $try)"
	done
	stack_log "nginx did not start"
	stack_tail "$prefix/start.err"
	return 1
}

# stack_nginx_upstream_template TEMPLATE OUT SOCKET...: TEMPLATE (such as
# nginx/idemflow-local.conf.in) with one upstream of all the SOCKETs (round
# robin) in place of the one @SOCKET@: several idemflow-fcgi instances
# behind one nginx. Render OUT with stack_nginx_start as usual.
# max_fails=0: by default one failed request (a worker killed mid-request
# is one) takes its whole instance out for 10 s, and one such failure per
# instance leaves "no live upstreams" and every request answered 503. A
# stopped instance is still skipped: a refused connect goes to the next
# server within the same request.
stack_nginx_upstream_template() {
	local template=$1 out=$2
	shift 2
	awk -v socks="$*" '
		/^http \{/ { print; print "    upstream idemflow_pool {"; n = split(socks, s, " ")
			for (i = 1; i <= n; i++) print "        server unix:" s[i] " max_fails=0;"
			print "    }"; next }
		{ sub(/fastcgi_pass unix:@SOCKET@;/, "fastcgi_pass idemflow_pool;"); print }
	' "$template" >"$out" || return 1
	grep -q 'fastcgi_pass idemflow_pool;' "$out" && grep -q 'upstream idemflow_pool' "$out"
}

# stack_sink_start DIR PORT: a webhook receiver for the dispatcher's HTTP
# sink: an nginx with prefix DIR on 127.0.0.1:PORT answering every request
# 204 over keep-alive connections, logging nothing. Stop it with
# stack_nginx_stop DIR.
stack_sink_start() {
	local p=$1 port=$2
	install -d -m 755 -- "$p" "$p/tmp" || return 1
	cat >"$p/nginx.conf" <<EOT
$(stack_is_root && echo "user www-data;")
daemon on;
worker_processes 1;
pid $p/nginx.pid;
error_log $p/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $p/tmp;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$port;
        location / { return 204; }
    }
}
EOT
	stack_is_root && chown -R www-data "$p/tmp"
	"$(stack_nginx_bin)" -p "$p" -c nginx.conf || return 1
	STACK_NGINX_PREFIX=$p
}

# stack_nginx_stop [PREFIX]: graceful quit, then TERM, then KILL (workers too).
stack_nginx_stop() {
	local prefix=${1:-${STACK_NGINX_PREFIX:-}} pid
	[[ -n $prefix ]] || return 0
	pid=$(stack_pid_from "$prefix/nginx.pid") || return 0
	kill -QUIT "$pid" 2>/dev/null || return 0
	stack_wait_gone "$pid" 10 && return 0
	kill -TERM "$pid" 2>/dev/null || true
	stack_wait_gone "$pid" 5 && return 0
	stack_log "nginx $pid did not stop: killing it"
	stack_kill_children "$pid" KILL
	kill -KILL "$pid" 2>/dev/null || true
	stack_wait_gone "$pid" 5
}

# ------------------------------------------------------------------ RabbitMQ

# stack_rabbit_bindir: print the directory of the real rabbitmq-server and
# rabbitmqctl. Debian's /usr/sbin ones are wrappers that switch to the system
# node's HOME and log files, which a private node must not touch.
stack_rabbit_bindir() {
	if [[ -n ${RABBITMQ_BINDIR:-} ]]; then
		echo "$RABBITMQ_BINDIR"
	elif [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then
		echo /usr/lib/rabbitmq/bin
	else
		stack_log "RabbitMQ not found (install the rabbitmq-server package)"
		return 1
	fi
}

# stack_rabbit_install_dir DIR MODE: create DIR owned by the broker's owner.
stack_rabbit_install_dir() {
	stack_install_dir rabbitmq "$1" "$2"
}

# _stack_rabbit_prefix RDIR: set STACK_RABBIT_PREFIX to the command prefix
# that runs a program as the broker's owner (rabbitmq when root) with exactly
# the node environment saved in RDIR/env, so the server and rabbitmqctl find
# the same node, epmd and Erlang cookie.
_stack_rabbit_prefix() {
	local envv=()
	mapfile -t envv <"$1/env" || return 1
	STACK_RABBIT_PREFIX=(env "${envv[@]}")
	if stack_is_root; then
		STACK_RABBIT_PREFIX=(runuser -u rabbitmq -- "${STACK_RABBIT_PREFIX[@]}")
	fi
}

# stack_as_rabbit RDIR CMD...: run CMD from / with the node's environment.
stack_as_rabbit() {
	local rdir=$1
	shift
	_stack_rabbit_prefix "$rdir" || return 1
	(cd / && "${STACK_RABBIT_PREFIX[@]}" "$@")
}

# _stack_rabbit_write_env RDIR: the node's environment, one NAME=VALUE a line.
# HOME is private so the Erlang cookie is created there; the empty
# rabbitmq-env.conf and the private config keep /etc/rabbitmq out of it.
_stack_rabbit_write_env() {
	local rdir=$1
	# beam's command line carries "-home $rdir/home", so stack_sweep finds it.
	cat >"$rdir/env" <<EOT
HOME=$rdir/home
RABBITMQ_NODENAME=$STACK_RABBIT_NODE
RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
RABBITMQ_NODE_PORT=$STACK_RABBIT_PORT
RABBITMQ_DIST_PORT=$STACK_RABBIT_DIST_PORT
ERL_EPMD_PORT=$STACK_RABBIT_EPMD_PORT
ERL_EPMD_ADDRESS=127.0.0.1
RABBITMQ_MNESIA_BASE=$rdir/mnesia
RABBITMQ_LOG_BASE=$rdir/log
RABBITMQ_PID_FILE=$rdir/rabbit.pid
RABBITMQ_CONFIG_FILE=$rdir/rabbitmq.conf
RABBITMQ_ADVANCED_CONFIG_FILE=$rdir/advanced.config
RABBITMQ_ENABLED_PLUGINS_FILE=$rdir/enabled_plugins
RABBITMQ_CONF_ENV_FILE=$rdir/rabbitmq-env.conf
ERL_CRASH_DUMP=$rdir/log/erl_crash.dump
RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-start_epmd false
EOT
}

# _stack_rabbit_epmd_start RDIR: our own epmd on $STACK_RABBIT_EPMD_PORT, in
# its own session (Ctrl-C in the terminal must not take it away from the node
# before the node stops). The node is told not to start one (-start_epmd
# false), so this is the only one and its pid is known: RDIR/epmd.pid.
_stack_rabbit_epmd_start() {
	local rdir=$1 epmd pid tenths=50
	epmd=$(command -v epmd) || { stack_log "epmd not found (install erlang-base)"; return 1; }
	# argv[0] names the directory, for stack_sweep.
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c 'exec -a "$1" "$2" -port "$3" -address 127.0.0.1' _ \
		"$rdir/epmd" "$epmd" "$STACK_RABBIT_EPMD_PORT" </dev/null >>"$rdir/epmd.log" 2>&1 &
	pid=$!
	disown "$pid"
	echo "$pid" >"$rdir/epmd.pid"
	until stack_port_open "$STACK_RABBIT_EPMD_PORT"; do
		stack_alive "$pid" || break
		((tenths-- > 0)) || break
		sleep 0.1
	done
	# Someone else's listener also opens the port: ours must still be
	# alive a moment later (a failed bind makes it exit at once).
	sleep 0.2
	if ! stack_port_open "$STACK_RABBIT_EPMD_PORT" || ! stack_alive "$pid"; then
		stack_log "epmd did not start on port $STACK_RABBIT_EPMD_PORT"
		stack_tail "$rdir/epmd.log"
		kill -KILL "$pid" 2>/dev/null || true
		rm -f -- "$rdir/epmd.pid"
		return 1
	fi
}

# _stack_rabbit_wait RDIR PID BINDIR: wait up to 60s for the node to boot.
# The port alone proves nothing (another program may have taken it since
# stack_free_port): rabbitmqctl asks our node itself, by name, through our
# epmd. Returns 0 when it is up, 1 when it exited, 2 on timeout.
_stack_rabbit_wait() {
	local rdir=$1 pid=$2 bindir=$3 tenths=600
	until [[ -s $rdir/rabbit.pid ]]; do
		stack_alive "$pid" || return 1
		((tenths-- > 0)) || return 2
		sleep 0.1
	done
	if ! stack_as_rabbit "$rdir" "$bindir/rabbitmqctl" -q -t 60 wait "$rdir/rabbit.pid" \
		>>"$rdir/wait.out" 2>&1; then
		# A node that failed to boot takes a few seconds to exit.
		stack_wait_gone "$pid" 10 && return 1
		stack_tail "$rdir/wait.out"
		return 2
	fi
	stack_port_open "$STACK_RABBIT_PORT" || return 1
}

# stack_rabbit_start DIR: start a private RabbitMQ node with everything under
# DIR/rabbit (data, logs, cookie, its own epmd), AMQP on a free 127.0.0.1 port,
# no plugins. Exports IDEMFLOW_AMQP_URL (guest may log in from loopback); sets
# STACK_RABBIT_DIR, STACK_RABBIT_PORT and STACK_RABBIT_LOG.
stack_rabbit_start() {
	local dir=$1 rdir bindir pid try rc
	bindir=$(stack_rabbit_bindir) || return 1
	rdir=$dir/rabbit
	STACK_RABBIT_DIR=$rdir
	STACK_RABBIT_NODE=idf$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')@localhost
	stack_rabbit_install_dir "$rdir" 700 || return 1
	stack_rabbit_install_dir "$rdir/home" 700 || return 1
	: >"$rdir/rabbitmq-env.conf"
	echo '[].' >"$rdir/enabled_plugins"
	cat >"$rdir/rabbitmq.conf" <<'EOT'
# written by scripts/lib/stack.sh: a private node on loopback
loopback_users.guest = true
# A nearly full disk must not block the publishers of a throwaway node.
disk_free_limit.absolute = 1MB
log.console = false
log.file.level = info
EOT
	for try in 1 2 3; do
		STACK_RABBIT_PORT=$(stack_free_port) || return 1
		STACK_RABBIT_DIST_PORT=$(stack_free_port "$STACK_RABBIT_PORT") || return 1
		STACK_RABBIT_EPMD_PORT=$(stack_free_port "$STACK_RABBIT_PORT" \
			"$STACK_RABBIT_DIST_PORT") || return 1
		STACK_RABBIT_LOG=$rdir/log/$STACK_RABBIT_NODE.log
		rm -f -- "$rdir/rabbit.pid"
		_stack_rabbit_write_env "$rdir"
		stack_is_root && chown -R rabbitmq:rabbitmq -- "$rdir"
		_stack_rabbit_epmd_start "$rdir" || continue
		_stack_rabbit_prefix "$rdir" || return 1
		# In the foreground and in its own session, so that one process
		# group holds the whole node (beam included) for stack_rabbit_stop.
		(cd / && exec setsid "${STACK_RABBIT_PREFIX[@]}" "$bindir/rabbitmq-server") \
			</dev/null >>"$rdir/server.out" 2>&1 &
		pid=$!
		disown "$pid"
		echo "$pid" >"$rdir/server.pgid"
		rc=0
		_stack_rabbit_wait "$rdir" "$pid" "$bindir" || rc=$?
		if ((rc == 0)); then
			export IDEMFLOW_AMQP_URL=amqp://guest:guest@127.0.0.1:$STACK_RABBIT_PORT/
			return 0
		fi
		if ((rc == 1)); then
			stack_log "RabbitMQ exited during startup (attempt $try)"
		else
			stack_log "RabbitMQ does not answer on 127.0.0.1:$STACK_RABBIT_PORT after 60s"
		fi
		stack_tail "$rdir/server.out"
		stack_tail "$STACK_RABBIT_LOG"
		stack_rabbit_stop "$rdir"
		# Only a port taken since stack_free_port is worth another try.
		((rc == 1)) || break
	done
	return 1
}

# stack_rabbit_stop [RDIR]: stop the node in RDIR (DIR/rabbit of
# stack_rabbit_start): rabbitmqctl stop, then SIGTERM and SIGKILL to its
# process group; then its epmd; then anything else still naming RDIR.
stack_rabbit_stop() {
	local rdir=${1:-${STACK_RABBIT_DIR:-}} bindir pgid pid port
	[[ -n $rdir && -d $rdir ]] || return 0
	pgid=$(stack_pid_from "$rdir/server.pgid") || pgid=''
	if [[ -n $pgid ]] && kill -0 -- "-$pgid" 2>/dev/null; then
		bindir=$(stack_rabbit_bindir) || bindir=''
		if [[ -z $bindir ]] || ! stack_as_rabbit "$rdir" "$bindir/rabbitmqctl" -q -t 30 stop \
			>>"$rdir/stop.out" 2>&1; then
			kill -TERM -- "-$pgid" 2>/dev/null || true
		fi
		if ! stack_wait_gone "$pgid" 15; then
			stack_log "RabbitMQ $pgid did not stop: killing it"
		fi
		kill -KILL -- "-$pgid" 2>/dev/null || true
		stack_wait_gone "$pgid" 5 || true
	fi
	rm -f -- "$rdir/server.pgid"
	# An Erlang tool finding no epmd on the port starts its own daemon
	# there, outside our process group: ask whichever one listens to quit.
	port=$(sed -n 's/^ERL_EPMD_PORT=//p' "$rdir/env" 2>/dev/null) || port=''
	if [[ -n $port ]] && command -v epmd >/dev/null 2>&1; then
		timeout 5 epmd -port "$port" -kill >/dev/null 2>&1 || true
	fi
	pid=$(stack_pid_from "$rdir/epmd.pid") || pid=''
	if [[ -n $pid ]] && stack_alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		stack_wait_gone "$pid" 5 || kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f -- "$rdir/epmd.pid"
	# Last resort: beam carries "-home RDIR/home", our epmd's argv[0] is RDIR/epmd.
	stack_sweep "$rdir"
	return 0
}

# ---------------------------------------------------------------- NATS

# stack_nats_bin: print the nats-server program.
stack_nats_bin() {
	local bin
	for bin in "${NATS_SERVER:-}" /usr/sbin/nats-server /usr/bin/nats-server; do
		[[ -n $bin && -x $bin ]] && { echo "$bin"; return 0; }
	done
	bin=$(command -v nats-server 2>/dev/null) && { echo "$bin"; return 0; }
	stack_log "nats-server not found (install the nats-server package)"
	return 1
}

# _stack_nats_user: the user a private server runs as when we are root:
# nats (the Debian package's), else nobody.
_stack_nats_user() {
	if getent passwd nats >/dev/null 2>&1; then echo nats; else echo nobody; fi
}

# _stack_nats_write_conf NDIR: the server's configuration, on the ports in
# STACK_NATS_PORT (clients) and STACK_NATS_MONITOR_PORT (HTTP monitoring).
_stack_nats_write_conf() {
	local ndir=$1
	cat >"$ndir/nats.conf" <<EOT
# written by scripts/lib/stack.sh: a private JetStream server on loopback
server_name: idf_$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
host: 127.0.0.1
port: $STACK_NATS_PORT
http: 127.0.0.1:$STACK_NATS_MONITOR_PORT
pid_file: "$ndir/nats.pid"
jetstream {
  store_dir: "$ndir/js"
  max_memory_store: 64MB
  max_file_store: 1GB
}
EOT
}

# stack_nats_run NDIR: start the server configured in NDIR/nats.conf (by
# stack_nats_start, or an earlier run: the same ports, the same streams
# and messages) and wait up to 30 s until JetStream answers on its
# monitoring port. Sets STACK_NATS_PORT, STACK_NATS_MONITOR_PORT and
# STACK_NATS_LOG (its output, NDIR/server.out).
stack_nats_run() {
	local ndir=$1 bin user pid tenths=300
	bin=$(stack_nats_bin) || return 1
	STACK_NATS_LOG=$ndir/server.out
	STACK_NATS_PORT=$(sed -n 's/^port: //p' "$ndir/nats.conf")
	STACK_NATS_MONITOR_PORT=$(sed -n 's/^http: 127.0.0.1://p' "$ndir/nats.conf")
	rm -f -- "$ndir/nats.pid"
	# In its own session, so that one process group holds it; its command
	# line names NDIR, for stack_sweep.
	if stack_is_root; then
		user=$(_stack_nats_user)
		(cd / && exec setsid runuser -u "$user" -- "$bin" -c "$ndir/nats.conf") \
			</dev/null >>"$STACK_NATS_LOG" 2>&1 &
	else
		(cd / && exec setsid "$bin" -c "$ndir/nats.conf") </dev/null >>"$STACK_NATS_LOG" 2>&1 &
	fi
	pid=$!
	disown "$pid"
	echo "$pid" >"$ndir/server.pgid"
	until curl -fsS -o /dev/null --max-time 2 \
		"http://127.0.0.1:$STACK_NATS_MONITOR_PORT/healthz" 2>/dev/null; do
		if ! stack_alive "$pid"; then
			stack_log "nats-server exited during startup"
			stack_tail "$STACK_NATS_LOG"
			return 1
		fi
		if ((tenths-- <= 0)); then
			stack_log "nats-server does not answer on 127.0.0.1:$STACK_NATS_MONITOR_PORT after 30s"
			stack_tail "$STACK_NATS_LOG"
			return 2
		fi
		sleep 0.1
	done
	stack_port_open "$STACK_NATS_PORT"
}

# stack_nats_start DIR: start a private NATS server with JetStream, all
# under DIR/nats (configuration, streams, log), clients and monitoring on
# free 127.0.0.1 ports; as root, as the nats user. Exports IDEMFLOW_NATS_URL
# (nats://127.0.0.1:PORT), IDEMFLOW_NATS_MONITOR (http://127.0.0.1:PORT) and
# IDEMFLOW_NATS_DIR; sets STACK_NATS_DIR and STACK_NATS_LOG.
stack_nats_start() {
	local dir=$1 ndir try rc
	stack_nats_bin >/dev/null || return 1
	ndir=$dir/nats
	STACK_NATS_DIR=$ndir
	if stack_is_root; then
		install -d -o "$(_stack_nats_user)" -m 700 -- "$ndir" || return 1
	else
		install -d -m 700 -- "$ndir" || return 1
	fi
	for try in 1 2 3; do
		STACK_NATS_PORT=$(stack_free_port) || return 1
		STACK_NATS_MONITOR_PORT=$(stack_free_port "$STACK_NATS_PORT") || return 1
		_stack_nats_write_conf "$ndir"
		rc=0
		stack_nats_run "$ndir" || rc=$?
		if ((rc == 0)); then
			export IDEMFLOW_NATS_URL=nats://127.0.0.1:$STACK_NATS_PORT
			export IDEMFLOW_NATS_MONITOR=http://127.0.0.1:$STACK_NATS_MONITOR_PORT
			export IDEMFLOW_NATS_DIR=$ndir
			return 0
		fi
		stack_nats_stop "$ndir"
		# Only a port taken since stack_free_port is worth another try.
		((rc == 1)) || break
		stack_log "nats-server did not start (attempt $try)"
	done
	return 1
}

# stack_nats_stop [NDIR]: SIGTERM to the server's process group (it closes
# its clients and its streams' files), SIGKILL after 15 s.
stack_nats_stop() {
	local ndir=${1:-${STACK_NATS_DIR:-}} pgid
	[[ -n $ndir && -d $ndir ]] || return 0
	pgid=$(stack_pid_from "$ndir/server.pgid") || pgid=''
	if [[ -n $pgid ]] && kill -0 -- "-$pgid" 2>/dev/null; then
		kill -TERM -- "-$pgid" 2>/dev/null || true
		if ! stack_wait_gone "$pgid" 15; then
			stack_log "nats-server $pgid did not stop: killing it"
			kill -KILL -- "-$pgid" 2>/dev/null || true
			stack_wait_gone "$pgid" 5 || true
		fi
	fi
	rm -f -- "$ndir/server.pgid"
	stack_sweep "$ndir"
	return 0
}

# stack_nats_stream_add URL NAME SUBJECTS: create the JetStream stream NAME
# (file storage) taking SUBJECTS (e.g. 'idemflow.>') on the server at URL
# (nats://host:port), unless it exists, through JetStream's API on the NATS
# protocol itself (Debian ships no nats command). Prints nothing; returns
# non-zero with the server's answer when it refuses.
stack_nats_stream_add() {
	python3 - "$1" "$2" "$3" <<'EOT'
import json, socket, sys
url, name, subjects = sys.argv[1:4]
host, port = url.split("://", 1)[-1].rsplit("@", 1)[-1].split(":")
sock = socket.create_connection((host, int(port)), timeout=10)
f = sock.makefile("rb")
if not f.readline().startswith(b"INFO"):
    sys.exit("not a NATS server at %s" % url)
req = json.dumps({"name": name, "subjects": [subjects], "storage": "file"}).encode()
sock.sendall(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n'
             b"SUB _INBOX.stack 1\r\n"
             b"PUB $JS.API.STREAM.CREATE.%s _INBOX.stack %d\r\n%s\r\n"
             % (name.encode(), len(req), req))
while True:
    line = f.readline()
    if not line:
        sys.exit("the server closed the connection")
    if line.startswith(b"PING"):
        sock.sendall(b"PONG\r\n")
    elif line.startswith(b"-ERR"):
        sys.exit(line.decode().strip())
    elif line.startswith(b"HMSG"):
        sys.exit("no JetStream on %s (no responders)" % url)
    elif line.startswith(b"MSG"):
        size = int(line.split()[-1])
        answer = json.loads(f.read(size + 2)[:size])
        error = answer.get("error")
        # The same stream created again is no error; one of that name
        # with another configuration is (10058).
        if error:
            sys.exit("stream %s: %s" % (name, error.get("description")))
        break
EOT
}
