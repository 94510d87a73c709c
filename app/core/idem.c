/* idem.c - Idempotency-Key syntax and stored-row decisions (see idem.h). */
#include "core/idem.h"

#include <string.h>

int idem_key_valid(const char *key)
{
	size_t n = 0;

	if (key == NULL)
		return 0;
	for (; key[n]; n++) {
		unsigned char c = (unsigned char)key[n];
		if (c < 0x21 || c > 0x7e || n >= IDEM_KEY_MAX)
			return 0;
	}
	return n >= 1;
}

int idem_key_parse(const char *value, char out[IDEM_KEY_MAX + 1])
{
	const char *p = value;
	size_t n = 0;

	out[0] = '\0';
	if (*p != '"') {
		/* The bare form: the value itself. */
		n = strlen(p);
		if (n > IDEM_KEY_MAX)
			return -1;
		memcpy(out, p, n + 1);
		return 0;
	}
	/* RFC 8941 4.2.5, Parsing a String. */
	for (p++;; p++) {
		unsigned char c = (unsigned char)*p;
		if (c == '\\') {
			c = (unsigned char)*++p;
			if (c != '"' && c != '\\')
				goto bad;
		} else if (c == '"') {
			break;
		} else if (c < 0x20 || c > 0x7e) {
			goto bad; /* also the NUL of an unterminated string */
		}
		if (n >= IDEM_KEY_MAX)
			goto bad;
		out[n++] = (char)c;
	}
	if (p[1] != '\0')
		goto bad; /* parameters, a second item, or garbage */
	out[n] = '\0';
	return 0;
bad:
	out[0] = '\0';
	return -1;
}

void idem_fp_text(char out[IDEM_FP_TEXT], const uint8_t fp[FP_LEN])
{
	out[0] = '\\';
	out[1] = 'x';
	fp_hex(out + 2, fp, FP_LEN);
}

enum idem_outcome idem_compare(const char *stored_fp_text, const char fp_text[IDEM_FP_TEXT])
{
	return strcmp(stored_fp_text, fp_text) == 0 ? IDEM_REPLAYED : IDEM_CONFLICT;
}

const char *idem_outcome_name(enum idem_outcome o)
{
	static const char *const names[] = { "none", "created", "replayed", "conflict",
		                             "in_flight" };
	return names[o];
}
