/* test_idem.c - Idempotency-Key syntax, stored-row decisions, and the
 * order of the ids keyed creates make. */
#include <criterion/criterion.h>
#include <string.h>
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
