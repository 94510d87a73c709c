/*
 * token.c - "idemflow token": issue, revoke and list a tenant's bearer
 * tokens. Only a token's BLAKE2b hash is stored (core/fp.h), so a new
 * token is printed once, on stdout and alone, for a script to capture;
 * a list shows ids, tenants and states, never tokens. How the server
 * checks a token and caches its answer is the server's business.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "cli/cli.h"
#include "core/db.h"
#include "core/fp.h"
#include "core/ids.h"

/* "\x" and the hex digits of a token's hash: a bytea parameter. */
#define TOKEN_HASH_HEX_LEN (2 + 2 * FP_LEN + 1)

static void token_hash_hex(char out[TOKEN_HASH_HEX_LEN], const char *token)
{
	uint8_t hash[FP_LEN];

	fp_token(hash, token, strlen(token));
	out[0] = '\\';
	out[1] = 'x';
	fp_hex(out + 2, hash, FP_LEN);
}

/* Sleep ms milliseconds, through interruptions. */
static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	while (ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* token create --tenant NAME: the token on stdout, its id on stderr. */
static int token_create(PGconn *conn, const char *tenant)
{
	char token[IDS_TOKEN_LEN + 1], hex[TOKEN_HASH_HEX_LEN];
	const char *p[2] = { hex, tenant };
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	if (ids_token(token) < 0) {
		fprintf(stderr, "idemflow: could not read random bytes\n");
		return EX_OSERR;
	}
	token_hash_hex(hex, token);
	res = db_exec(conn,
	              "INSERT INTO api_tokens (token_hash, tenant_id)\n"
	              "SELECT $1, id\n"
	              "  FROM tenants\n"
	              " WHERE name = $2\n"
	              "RETURNING id\n",
	              2, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", tenant);
		rc = EX_DATAERR;
		goto out;
	}
	fprintf(stderr, "idemflow: token id %s for tenant %s (shown once; keep it safe)\n",
	        PQgetvalue(res, 0, 0), tenant);
	printf("%s\n", token);
out:
	PQclear(res);
	return rc;
}

/* token revoke TOKEN | --id N. Revoking twice keeps the first time. */
static int token_revoke(PGconn *conn, const struct conf *c, int argc, char **argv)
{
	char hex[TOKEN_HASH_HEX_LEN];
	const char *sql, *p[1];
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	if (argc == 3 && strcmp(argv[1], "--id") == 0) {
		sql = "UPDATE api_tokens\n"
		      "   SET revoked_at = coalesce(revoked_at, now())\n"
		      " WHERE id = $1::bigint\n"
		      "RETURNING id\n";
		p[0] = argv[2];
	} else if (argc == 2) {
		token_hash_hex(hex, argv[1]);
		sql = "UPDATE api_tokens\n"
		      "   SET revoked_at = coalesce(revoked_at, now())\n"
		      " WHERE token_hash = $1\n"
		      "RETURNING id\n";
		p[0] = hex;
	} else
		return cli_usage_error();
	res = db_exec(conn, sql, 1, p, &e);
	if (res == NULL) {
		if (strcmp(e.sqlstate, "22P02") == 0) {
			fprintf(stderr, "idemflow: invalid token id \"%s\"\n", p[0]);
			return EX_DATAERR;
		}
		return cli_db_fail(&e);
	}
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no such token\n");
		rc = EX_DATAERR;
		goto out;
	}
	/* A worker may answer a replay from memory for replay_cache_ttl
	 * after it last asked the database (rcache.h): once that has
	 * passed, no worker answers this token. */
	sleep_ms(c->replay_cache_ttl);
	printf("revoked token %s\n", PQgetvalue(res, 0, 0));
out:
	PQclear(res);
	return rc;
}

/* token list [--tenant NAME] */
static int token_list(PGconn *conn, const char *tenant)
{
	const char *p[1] = { tenant }; /* NULL: every tenant's */
	PGresult *res;
	struct err e;

	res = db_exec(conn,
	              "SELECT t.id, n.name, t.created_at,\n"
	              "       CASE WHEN t.revoked_at IS NULL THEN 'active' ELSE 'revoked' END\n"
	              "  FROM api_tokens t\n"
	              "  JOIN tenants n ON n.id = t.tenant_id\n"
	              " WHERE $1::text IS NULL OR n.name = $1\n"
	              " ORDER BY t.id\n",
	              1, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	cli_print_rows(res);
	PQclear(res);
	return EX_OK;
}

int cli_token(PGconn *conn, struct conf *c, int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[0], "create") == 0 && strcmp(argv[1], "--tenant") == 0)
		return token_create(conn, argv[2]);
	if ((argc == 2 || argc == 3) && strcmp(argv[0], "revoke") == 0)
		return token_revoke(conn, c, argc, argv);
	if (argc == 1 && strcmp(argv[0], "list") == 0)
		return token_list(conn, NULL);
	if (argc == 3 && strcmp(argv[0], "list") == 0 && strcmp(argv[1], "--tenant") == 0)
		return token_list(conn, argv[2]);
	return cli_usage_error();
}
