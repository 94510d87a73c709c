/* utf8.c - well-formed UTF-8 and hexadecimal digits (see utf8.h). */
#include "core/utf8.h"

#include <stdint.h>
#include <string.h>

/*
 * json-c's own check lets overlong forms and encoded surrogates through,
 * and PostgreSQL then refused the row: a 500 for a client's mistake. So
 * the rule is written out here, once.
 */
size_t utf8_len(const unsigned char *s, size_t left)
{
	uint32_t cp, min;
	size_t n;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, cp = s[0] & 0x1fu, min = 0x80;
	else if ((s[0] & 0xf0) == 0xe0)
		n = 3, cp = s[0] & 0x0fu, min = 0x800;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, cp = s[0] & 0x07u, min = 0x10000;
	else
		return 0;
	if (left < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

size_t utf8_copy(char *dst, size_t dstsz, const char *src)
{
	static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */
	const unsigned char *s = (const unsigned char *)src;
	size_t left = strlen(src), o = 0;

	while (left > 0) {
		size_t n = utf8_len(s, left);
		const char *from = n ? (const char *)s : replacement;
		size_t out = n ? n : sizeof(replacement) - 1;

		if (o + out > dstsz - 1)
			break;
		memcpy(dst + o, from, out);
		o += out;
		n = n ? n : 1;
		s += n;
		left -= n;
	}
	dst[o] = '\0';
	return o;
}

int utf8_hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}
