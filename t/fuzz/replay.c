/*
 * replay.c - run a fuzz target's stored inputs without libFuzzer.
 *
 * Linked with one target (fuzz_<name>.c) as t/fuzz/replay_<name> and run by
 * make check: every file under t/fuzz/corpus/<name>/ (the seeds and what
 * fuzzing kept) and t/fuzz/regress/<name>/ (inputs that once broke the
 * target, one per fixed bug) goes through LLVMFuzzerTestOneInput, with any
 * compiler and, in a sanitizer build, under ASan and UBSan. A broken
 * property aborts; so does a missing corpus, which would make the test
 * prove nothing.
 *
 * Usage: replay_<name> [FILE|DIR...]; without arguments, the two
 * directories above, found from $top_srcdir (or the current directory).
 */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Feed one file, in an allocation of exactly its size. */
static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data = NULL;
	long size;
	int rc = -1;

	if (f == NULL) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
		goto out;
	data = malloc(size > 0 ? (size_t)size : 1);
	if (data == NULL || fread(data, 1, (size_t)size, f) != (size_t)size)
		goto out;
	LLVMFuzzerTestOneInput(data, (size_t)size);
	rc = 0;
out:
	if (rc < 0)
		fprintf(stderr, "replay: could not read %s\n", path);
	free(data);
	fclose(f);
	return rc;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

/* Feed every regular file of dir, in name order. Returns how many, or -1. */
static long replay_dir(const char *dir, int must_exist)
{
	struct dirent **names;
	char path[4096];
	long count = 0;
	int n = scandir(dir, &names, NULL, by_name);

	if (n < 0) {
		if (!must_exist && errno == ENOENT)
			return 0;
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(path) < 0)
				count = -1;
			else if (count >= 0)
				count++;
		}
		free(names[i]);
	}
	free(names);
	return count;
}

static long replay_arg(const char *arg)
{
	struct stat st;

	if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode))
		return replay_dir(arg, 1);
	return replay_file(arg) < 0 ? -1 : 1;
}

int main(int argc, char **argv)
{
	const char *top = getenv("top_srcdir");
	const char *base = strrchr(argv[0], '/');
	const char *name;
	char dir[4096];
	long corpus, regress;

	if (argc > 1) {
		long total = 0;
		if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
			printf("Usage: %s [FILE|DIR...]\n"
			       "Run each input through the fuzz target; without arguments, every "
			       "file\nin t/fuzz/corpus/TARGET and t/fuzz/regress/TARGET "
			       "(under $top_srcdir).\n",
			       argv[0]);
			return 0;
		}
		for (int i = 1; i < argc; i++) {
			long n = replay_arg(argv[i]);
			if (n < 0)
				return 1;
			total += n;
		}
		printf("%s: %ld inputs replayed\n", argv[0], total);
		return 0;
	}
	/* replay_canon (or lt-replay_canon, ...) runs target canon. */
	base = base ? base + 1 : argv[0];
	name = strstr(base, "replay_");
	if (name == NULL) {
		fprintf(stderr, "replay: cannot tell the target from the name %s\n", base);
		return 2;
	}
	name += strlen("replay_");
	if (top == NULL || *top == '\0')
		top = ".";
	snprintf(dir, sizeof(dir), "%s/t/fuzz/corpus/%s", top, name);
	corpus = replay_dir(dir, 1);
	snprintf(dir, sizeof(dir), "%s/t/fuzz/regress/%s", top, name);
	regress = replay_dir(dir, 0);
	if (corpus < 0 || regress < 0)
		return 1;
	if (corpus == 0) {
		fprintf(stderr, "replay: no corpus in %s/t/fuzz/corpus/%s\n", top, name);
		return 1;
	}
	printf("%s: %ld corpus and %ld regression inputs replayed, every property held\n", name,
	       corpus, regress);
	return 0;
}
