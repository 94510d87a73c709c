#!/usr/bin/env bash
# t/install/test_nginx_site.sh - the production site etc/idemflow.nginx,
# installed as a site of the stock Debian nginx.conf (included inside its
# http {} block, beside mime.types, conf.d/ and the modules), passes
# "nginx -t". Only the paths nginx would write to (pid file, logs) are
# moved to a temporary directory; the site is otherwise tested verbatim,
# which nginx -T shows: the site it read is the shipped file.
# Skipped (77) when nginx or its stock nginx.conf is not installed.
set -euo pipefail

: "${top_srcdir:?run me from make check}"
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
STOCK=${NGINX_STOCK_CONF:-/etc/nginx/nginx.conf}
[[ -x $NGINX && -f $STOCK ]] || { echo "SKIP: no nginx or no $STOCK"; exit 77; }

TMP=$(mktemp -d /tmp/idemflow-nginx.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT
mkdir -p "$TMP/sites-enabled" "$TMP/log"

# The stock configuration, with its sites-enabled/ replaced by ours.
grep -q '^[[:space:]]*include /etc/nginx/sites-enabled/\*;' "$STOCK" ||
	{ echo "FAIL: $STOCK does not include sites-enabled/*" >&2; exit 1; }
sed -e "s|/etc/nginx/sites-enabled/\*|$TMP/sites-enabled/*|" \
	-e "s|^\([[:space:]]*pid\) .*;|\1 $TMP/nginx.pid;|" \
	-e "s|/var/log/nginx/|$TMP/log/|g" "$STOCK" >"$TMP/nginx.conf"
sed -e "s|/var/log/nginx/|$TMP/log/|g" "$top_srcdir/etc/idemflow.nginx" \
	>"$TMP/sites-enabled/idemflow"

if ! out=$("$NGINX" -t -c "$TMP/nginx.conf" -p "$TMP/" -e "$TMP/log/error.log" 2>&1); then
	echo "FAIL: nginx -t rejects the production site:" >&2
	echo "$out" >&2
	exit 1
fi
# What nginx read as the site is the shipped file, but for the log paths:
# nginx -T prints every file it read, each under its name and followed by
# an empty line. A site that was not read at all (the include missed it)
# or read otherwise fails here.
"$NGINX" -T -c "$TMP/nginx.conf" -p "$TMP/" -e "$TMP/log/error.log" >"$TMP/dump" 2>/dev/null
awk -v f="# configuration file $TMP/sites-enabled/idemflow:" \
	'$0 == f { on = 1; next } /^# configuration file / { on = 0 } on' "$TMP/dump" |
	sed -e "s|$TMP/log/|/var/log/nginx/|g" | sed -e '$ { /^$/ d; }' >"$TMP/loaded"
if ! diff "$TMP/loaded" "$top_srcdir/etc/idemflow.nginx" >"$TMP/site.diff"; then
	echo "FAIL: nginx did not read the shipped site as it is" \
		"(<: what nginx read, >: etc/idemflow.nginx):" >&2
	cat "$TMP/site.diff" >&2
	exit 1
fi
# Warnings about the site (not the stock file's "user" as a non-root
# user) are failures too.
if grep -v 'the "user" directive makes sense only' <<<"$out" | grep -q '\[warn\]\|\[emerg\]'; then
	echo "FAIL: nginx -t warns about the production site:" >&2
	echo "$out" >&2
	exit 1
fi
echo "$out"
echo "ok: etc/idemflow.nginx passes nginx -t inside the stock $STOCK"
