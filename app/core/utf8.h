/*
 * utf8.h - the one rule for well-formed UTF-8, and the hexadecimal digits
 * of escapes. Shared by canon (request JSON), log (its JSON form) and the
 * dispatcher (errors kept in a text column); includes nothing, so that the
 * lowest modules of the core can use it.
 */
#ifndef IDF_UTF8_H
#define IDF_UTF8_H

#include <stddef.h>

/*
 * Length of the UTF-8 sequence at s, of which left bytes are readable
 * (left > 0): 1 for ASCII, 2-4 for a well-formed sequence (RFC 3629:
 * shortest form only, no UTF-16 surrogates, nothing above U+10FFFF), 0
 * when it is not one.
 */
size_t utf8_len(const unsigned char *s, size_t left);

/*
 * Copy the NUL-terminated src into dst (dstsz > 0 bytes, NUL-terminated) as
 * valid UTF-8 for a text column: each byte that does not begin a sequence
 * utf8_len accepts becomes U+FFFD, and the copy stops before a sequence
 * that would not fit whole, so a cut never splits a character. Returns the
 * bytes written, without the NUL.
 */
size_t utf8_copy(char *dst, size_t dstsz, const char *src);

/* The value of the hexadecimal digit c (as in a \uXXXX escape), or -1. */
int utf8_hex_digit(char c);

#endif
