/*
 * fuzz.h - what every fuzz target in t/fuzz shares.
 *
 * A target is one LLVMFuzzerTestOneInput that feeds its input to one part
 * of the program and checks properties that must hold for every input
 * (a canonical form is its own canonical form, a problem body is JSON, a
 * log line keeps its fields apart). The same file links two ways: with
 * libFuzzer (./configure --enable-fuzz CC=clang, scripts/fuzz) to search
 * for inputs that break it, and with replay.c (any compiler, make check)
 * to run the stored corpus and the inputs that once broke it.
 */
#ifndef IDF_FUZZ_H
#define IDF_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Called with every input; returns 0 (libFuzzer ignores other values). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property that failed is a finding like a crash: say which, then abort
 * so libFuzzer keeps the input and the replay test fails. */
#define FUZZ_CHECK(cond, ...)                                                                      \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__,        \
			        #cond);                                                            \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#endif
