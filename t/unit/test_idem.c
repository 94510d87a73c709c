/* test_idem.c - Idempotency-Key syntax, stored-row decisions, and the
 * order of the ids keyed creates make. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/idem.h"
#include "core/ids.h"

Test(idem, keys_of_printable_ascii_up_to_255_are_valid)
{
	char k[256];

	cr_assert(idem_key_valid("a"));
	cr_assert(idem_key_valid("0b7d6e8c-5c6f-4d8a-9d43-0c3b7f7f2f11"));
	cr_assert(idem_key_valid("order:42/attempt#1~!"));
	memset(k, 'k', 255);
	k[255] = '\0';
	cr_assert(idem_key_valid(k), "255 characters is the maximum");
}

Test(idem, empty_long_spaced_and_control_keys_are_invalid)
{
	char k[257];

	memset(k, 'k', 256);
	k[256] = '\0';
	cr_assert_not(idem_key_valid(k), "256 characters");
	cr_assert_not(idem_key_valid(""));
	cr_assert_not(idem_key_valid(NULL));
	cr_assert_not(idem_key_valid("a b"));
	cr_assert_not(idem_key_valid("a\tb"));
	cr_assert_not(idem_key_valid("a\x7f"));
	cr_assert_not(idem_key_valid("caf\xc3\xa9"));
	cr_assert_not(idem_key_valid("a\r\nX-Injected: 1"));
}

Test(idem, stored_fingerprint_decides_replay_or_conflict)
{
	uint8_t a[FP_LEN], b[FP_LEN];
	char ta[IDEM_FP_TEXT], tb[IDEM_FP_TEXT];

	memset(a, 0xab, sizeof(a));
	memset(b, 0xab, sizeof(b));
	b[31] = 0xac;
	idem_fp_text(ta, a);
	idem_fp_text(tb, b);
	cr_assert_eq(strncmp(ta, "\\xabab", 6), 0, "bytea text form");
	cr_assert_eq(strlen(ta), 66);
	cr_assert_eq(idem_compare(ta, ta), IDEM_REPLAYED);
	cr_assert_eq(idem_compare(ta, tb), IDEM_CONFLICT);
}

Test(idem, outcomes_have_log_names)
{
	cr_assert_str_eq(idem_outcome_name(IDEM_CREATED), "created");
	cr_assert_str_eq(idem_outcome_name(IDEM_REPLAYED), "replayed");
	cr_assert_str_eq(idem_outcome_name(IDEM_CONFLICT), "conflict");
	cr_assert_str_eq(idem_outcome_name(IDEM_IN_FLIGHT), "in_flight");
	cr_assert_str_eq(idem_outcome_name(IDEM_NONE), "none");
}

/*
 * The workflow list promises creation order for a client's sequential
 * creates, which different workers may serve: ids made one after the
 * other, in one process or in two taking turns, sort in the order they
 * were made, also within one millisecond.
 */
Test(ids, uuid7s_made_in_sequence_by_two_processes_sort_in_that_order)
{
	enum { ROUNDS = 2000 };
	char prev[IDS_UUID_LEN + 1], id[IDS_UUID_LEN + 1];
	int to_child[2], to_parent[2];
	pid_t pid;
	int status;

	cr_assert_eq(ids_uuid7(prev), 0);
	for (int i = 0; i < ROUNDS; i++) {
		cr_assert_eq(ids_uuid7(id), 0);
		cr_assert_gt(strcmp(id, prev), 0, "id %d: %s after %s", i, id, prev);
		memcpy(prev, id, sizeof(id));
	}
	cr_assert_eq(pipe(to_child), 0);
	cr_assert_eq(pipe(to_parent), 0);
	pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		/* Take the parent's id, answer with one made after it. */
		for (int i = 0; i < ROUNDS; i++) {
			if (read(to_child[0], prev, sizeof(prev)) != (ssize_t)sizeof(prev) ||
			    ids_uuid7(id) < 0 ||
			    write(to_parent[1], id, sizeof(id)) != (ssize_t)sizeof(id))
				_exit(1);
		}
		_exit(0);
	}
	for (int i = 0; i < ROUNDS; i++) {
		cr_assert_eq(ids_uuid7(prev), 0);
		cr_assert_gt(strcmp(prev, id), 0, "round %d: %s made after the child's %s", i, prev,
		             id);
		cr_assert_eq(write(to_child[1], prev, sizeof(prev)), (ssize_t)sizeof(prev));
		cr_assert_eq(read(to_parent[0], id, sizeof(id)), (ssize_t)sizeof(id));
		cr_assert_gt(strcmp(id, prev), 0, "round %d: the child's %s made after %s", i, id,
		             prev);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/*
 * The random bits of ids come from a per-process pool: a child forked with
 * the pool half used must not hand out the bytes its parent hands out next
 * (the supervisor forks every worker), nor the bytes of another child.
 */
Test(ids, a_fork_never_shares_the_random_bits_of_ids)
{
	char mine[3][IDS_UUID_LEN + 1], theirs[2][3][IDS_UUID_LEN + 1];
	int fds[2][2];
	pid_t pid[2];
	int status;

	cr_assert_eq(ids_uuid7(mine[0]), 0); /* the pool is read */
	for (int c = 0; c < 2; c++) {
		cr_assert_eq(pipe(fds[c]), 0);
		pid[c] = fork();
		cr_assert_neq(pid[c], -1);
		if (pid[c] == 0) {
			char id[IDS_UUID_LEN + 1];
			for (int i = 0; i < 3; i++)
				if (ids_uuid7(id) < 0 ||
				    write(fds[c][1], id, sizeof(id)) != (ssize_t)sizeof(id))
					_exit(1);
			_exit(0);
		}
		close(fds[c][1]);
	}
	for (int i = 0; i < 3; i++)
		cr_assert_eq(ids_uuid7(mine[i]), 0);
	for (int c = 0; c < 2; c++) {
		for (int i = 0; i < 3; i++)
			cr_assert_eq(read(fds[c][0], theirs[c][i], sizeof(theirs[c][i])),
			             (ssize_t)sizeof(theirs[c][i]));
		close(fds[c][0]);
		cr_assert_eq(waitpid(pid[c], &status, 0), pid[c]);
		cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	/* Characters 19 on are the 62 random bits (and the variant). */
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++) {
			cr_assert_str_neq(mine[i] + 19, theirs[0][j] + 19, "parent %s, child %s",
			                  mine[i], theirs[0][j]);
			cr_assert_str_neq(mine[i] + 19, theirs[1][j] + 19, "parent %s, child %s",
			                  mine[i], theirs[1][j]);
			cr_assert_str_neq(theirs[0][i] + 19, theirs[1][j] + 19, "children %s, %s",
			                  theirs[0][i], theirs[1][j]);
		}
}

/* The key a header value names: parse, then the key rules. */
static const char *key_of(const char *value)
{
	static char out[IDEM_KEY_MAX + 1];

	return idem_key_parse(value, out) == 0 && idem_key_valid(out) ? out : NULL;
}

Test(idem, quoted_and_bare_forms_name_the_same_key)
{
	cr_assert_str_eq(key_of("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""),
	                 "8e03978e-40d5-43e8-bc93-6894a57f9324");
	cr_assert_str_eq(key_of("8e03978e-40d5-43e8-bc93-6894a57f9324"),
	                 "8e03978e-40d5-43e8-bc93-6894a57f9324");
	cr_assert_str_eq(key_of("\"abc\""), "abc");
	cr_assert_str_eq(key_of("abc"), "abc");
	/* The two escapes of RFC 8941. */
	cr_assert_str_eq(key_of("\"a\\\"b\""), "a\"b");
	cr_assert_str_eq(key_of("\"a\\\\b\""), "a\\b");
	/* Bare keys keep their quotes and backslashes where they were. */
	cr_assert_str_eq(key_of("a\"b"), "a\"b");
	cr_assert_str_eq(key_of("a\\b"), "a\\b");
	cr_assert_str_eq(key_of("abc\""), "abc\"");
}

Test(idem, malformed_quoting_is_refused)
{
	char out[IDEM_KEY_MAX + 1];
	static const char *const bad[] = {
		"\"",              /* unterminated */
		"\"abc",           /* unterminated */
		"\"abc\\\"",       /* the closing quote escaped: unterminated */
		"\"a\\nb\"",       /* an escape RFC 8941 does not have */
		"\"a\\",           /* a backslash at the end */
		"\"caf\xc3\xa9\"", /* outside printable ASCII */
		"\"a\tb\"",        /* a control character */
		"\"a\x7f\"",       /* DEL */
		"\"abc\";v=1",     /* parameters */
		"\"abc\";v",       /* a parameter without value */
		"\"abc\" ",        /* anything after the closing quote */
		"\"abc\"x",        /* garbage */
		"\"abc\", \"d\"",  /* a list, not an item */
		"\"\"\"",          /* a quote after the string */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		strcpy(out, "untouched");
		cr_assert_eq(idem_key_parse(bad[i], out), -1, "%s", bad[i]);
		cr_assert_str_eq(out, "", "%s leaves no key", bad[i]);
	}
}

Test(idem, the_key_rules_apply_to_the_unquoted_value)
{
	char k[300];

	cr_assert_null(key_of("\"\""), "an empty string is an empty key");
	cr_assert_null(key_of("\"a b\""), "a space is a valid sf-string character, not key one");
	k[0] = '"';
	memset(k + 1, 'k', 255);
	strcpy(k + 256, "\"");
	cr_assert_not_null(key_of(k), "255 characters inside the quotes");
	cr_assert_eq(strlen(key_of(k)), 255);
	k[256] = 'k';
	strcpy(k + 257, "\"");
	cr_assert_null(key_of(k), "256 characters inside the quotes");
	memset(k, 'k', 256);
	k[256] = '\0';
	cr_assert_null(key_of(k), "256 characters bare");
}

/* In a child process: the id made at *at, written to fd. */
static void id_in_child(int fd, const struct timespec *at)
{
	pid_t pid = fork();
	int status;

	cr_assert_neq(pid, -1);
	if (pid == 0) {
		char id[IDS_UUID_LEN + 1];

		_exit(ids_uuid7_at(id, at) < 0 || write(fd, id, sizeof(id)) != (ssize_t)sizeof(id));
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/*
 * A pool's workers share the floor (the supervisor's mapping): a worker
 * that makes an id, and one forked after the wall clock stepped back a
 * second (a respawned worker, which never saw the first's ids), still make
 * them in order. The list's order holds across both.
 */
Test(ids, a_worker_forked_after_the_clock_stepped_back_still_sorts_after)
{
	atomic_ullong *floor =
	    mmap(NULL, sizeof(*floor), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct timespec now, back;
	char first[IDS_UUID_LEN + 1], second[IDS_UUID_LEN + 1];
	int p[2];

	cr_assert_neq(floor, MAP_FAILED);
	cr_assert_eq(pipe(p), 0);
	ids_share_clock(floor);
	clock_gettime(CLOCK_REALTIME, &now);
	back = now;
	back.tv_sec -= 1;
	id_in_child(p[1], &now);
	id_in_child(p[1], &back);
	cr_assert_eq(read(p[0], first, sizeof(first)), (ssize_t)sizeof(first));
	cr_assert_eq(read(p[0], second, sizeof(second)), (ssize_t)sizeof(second));
	cr_assert_gt(strcmp(second, first), 0, "%s, made after the step back, sorts before %s",
	             second, first);
}
