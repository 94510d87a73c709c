/* whsig.c - Standard Webhooks signing and verification (see whsig.h). */
#include "dispatch/whsig.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#define WHSIG_PREFIX "whsec_"
#define MAC_LEN      32 /* SHA-256 */
#define BAD_B64      "the text after \"whsec_\" is not valid base64"

/*
 * Strict standard base64 with padding, as the specification's libraries
 * write it. EVP_DecodeBlock alone is too lenient (it skips surrounding
 * whitespace) and reports padding as decoded zero bytes, so the text is
 * checked here and *pad tells the caller how many bytes to drop.
 */
static int b64_check(const char *s, size_t n, size_t *pad)
{
	*pad = 0;
	if (n == 0 || n % 4 != 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '=') {
			/* Only the last one or two characters may be padding. */
			if (i < n - 2 || (i == n - 2 && s[n - 1] != '='))
				return -1;
			(*pad)++;
		} else if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		             (c >= '0' && c <= '9') || c == '+' || c == '/')) {
			return -1;
		}
	}
	return 0;
}

int whsig_key(const char *secret, uint8_t *key, size_t *keylen, struct err *e)
{
	return whsig_key_named("secret", secret, key, keylen, e);
}

int whsig_key_named(const char *name, const char *secret, uint8_t *key, size_t *keylen,
                    struct err *e)
{
	const size_t plen = sizeof(WHSIG_PREFIX) - 1;
	/* DecodeBlock writes whole 3-byte groups, padding included. */
	unsigned char tmp[WHSIG_KEY_MAX + 3];
	const char *b64;
	size_t n, pad;
	int got;

	if (secret == NULL || *secret == '\0')
		return err_set(e, ERR_CONFIG, "%s is empty", name);
	if (strncmp(secret, WHSIG_PREFIX, plen) != 0) {
		n = strlen(secret);
		if (n > WHSIG_KEY_MAX)
			return err_set(e, ERR_CONFIG, "%s is longer than %d bytes", name,
			               WHSIG_KEY_MAX);
		if (n < WHSIG_KEY_MIN)
			return err_set(e, ERR_CONFIG,
			               "%s is %zu bytes, shorter than %d: use %d or more random "
			               "bytes, e.g. whsec_ and the base64 of 32 (openssl rand "
			               "-base64 32)",
			               name, n, WHSIG_KEY_MIN, WHSIG_KEY_MIN);
		memcpy(key, secret, n);
		*keylen = n;
		return 0;
	}
	/* The secret itself never goes into a message: messages get logged. */
	b64 = secret + plen;
	n = strlen(b64);
	if (b64_check(b64, n, &pad) < 0)
		return err_set(e, ERR_CONFIG, "%s: %s", name, BAD_B64);
	if (n / 4 * 3 - pad > WHSIG_KEY_MAX)
		return err_set(e, ERR_CONFIG, "%s: the decoded key is longer than %d bytes", name,
		               WHSIG_KEY_MAX);
	got = EVP_DecodeBlock(tmp, (const unsigned char *)b64, (int)n);
	if (got < 0 || (size_t)got < pad)
		return err_set(e, ERR_CONFIG, "%s: %s", name, BAD_B64);
	*keylen = (size_t)got - pad;
	if (*keylen < WHSIG_KEY_MIN) {
		OPENSSL_cleanse(tmp, sizeof(tmp));
		return err_set(e, ERR_CONFIG,
		               "%s: the decoded key is %zu bytes, shorter than %d: use %d or "
		               "more random bytes (openssl rand -base64 32)",
		               name, *keylen, WHSIG_KEY_MIN, WHSIG_KEY_MIN);
	}
	memcpy(key, tmp, *keylen);
	OPENSSL_cleanse(tmp, sizeof(tmp));
	return 0;
}

/* Sign with the timestamp as text: the signature covers the header's bytes. */
static int sign_text(const uint8_t *key, size_t keylen, const char *id, const char *ts,
                     const char *body, size_t len, char out[WHSIG_MAX], struct err *e)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int maclen = 0;
	size_t il = strlen(id), tl = strlen(ts), total;
	unsigned char *msg = NULL;
	int rc = -1;

	out[0] = '\0';
	if (keylen == 0 || keylen > INT_MAX || len > SIZE_MAX - il - tl - 2) {
		err_set(e, ERR_INTERNAL, "cannot sign: bad key or body length");
		goto done;
	}
	/* HMAC() is one-shot, so the signed content is assembled in one piece. */
	total = il + 1 + tl + 1 + len;
	msg = malloc(total);
	if (msg == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		goto done;
	}
	memcpy(msg, id, il);
	msg[il] = '.';
	memcpy(msg + il + 1, ts, tl);
	msg[il + 1 + tl] = '.';
	if (len > 0)
		memcpy(msg + il + tl + 2, body, len);
	if (HMAC(EVP_sha256(), key, (int)keylen, msg, total, mac, &maclen) == NULL ||
	    maclen != MAC_LEN) {
		err_set(e, ERR_INTERNAL, "HMAC-SHA256 failed");
		goto done;
	}
	memcpy(out, "v1,", 3);
	/* 4 * ceil(32 / 3) = 44 characters plus NUL: exactly fills out. */
	EVP_EncodeBlock((unsigned char *)out + 3, mac, MAC_LEN);
	rc = 0;
done:
	free(msg);
	return rc;
}

int whsig_sign(const uint8_t *key, size_t keylen, const char *id, long ts, const char *body,
               size_t len, char out[WHSIG_MAX], struct err *e)
{
	char tsbuf[24];

	snprintf(tsbuf, sizeof(tsbuf), "%ld", ts);
	return sign_text(key, keylen, id, tsbuf, body, len, out, e);
}

int whsig_sign_header(const uint8_t *key, size_t keylen, const uint8_t *key2, size_t key2len,
                      const char *id, long ts, const char *body, size_t len,
                      char out[WHSIG_HEADER_MAX], struct err *e)
{
	char second[WHSIG_MAX];

	/* WHSIG_HEADER_MAX holds the first entry, a space and the second. */
	if (whsig_sign(key, keylen, id, ts, body, len, out, e) < 0)
		return -1;
	if (key2 == NULL)
		return 0;
	if (whsig_sign(key2, key2len, id, ts, body, len, second, e) < 0) {
		out[0] = '\0';
		return -1;
	}
	snprintf(out + strlen(out), WHSIG_HEADER_MAX - strlen(out), " %s", second);
	return 0;
}

int whsig_verify(const uint8_t *key, size_t keylen, const char *id, const char *ts,
                 const char *body, size_t len, const char *header, long now, long tolerance_s,
                 struct err *e)
{
	char want[WHSIG_MAX];
	const size_t wlen = WHSIG_MAX - 1 - 3; /* the base64 after "v1," */
	const char *p;
	char *end;
	long t;

	if (id == NULL || ts == NULL || header == NULL)
		return err_set(e, ERR_INPUT,
		               "missing webhook-id, webhook-timestamp or webhook-signature");
	errno = 0;
	t = strtol(ts, &end, 10);
	if (*ts < '0' || *ts > '9' || *end != '\0' || errno != 0)
		return err_set(e, ERR_INPUT, "webhook-timestamp \"%.32s\" is not unix seconds", ts);
	if (tolerance_s >= 0 && (t < now - tolerance_s || t > now + tolerance_s))
		return err_set(e, ERR_INPUT,
		               "webhook-timestamp %ld is more than %ld s from now (%ld)", t,
		               tolerance_s, now);
	if (sign_text(key, keylen, id, ts, body, len, want, e) < 0)
		return -1;
	/* Several entries appear while a secret is being rotated; any v1 match will do. */
	for (p = header; *p;) {
		const char *tok, *sig;
		size_t toklen;

		while (*p == ' ')
			p++;
		tok = p;
		while (*p && *p != ' ')
			p++;
		toklen = (size_t)(p - tok);
		if (toklen < 3 || memcmp(tok, "v1,", 3) != 0)
			continue;
		sig = tok + 3;
		/* Constant time, so the comparison leaks nothing about the expected value. */
		if (toklen - 3 == wlen && CRYPTO_memcmp(sig, want + 3, wlen) == 0)
			return 0;
	}
	return err_set(e, ERR_INPUT, "no v1 signature in webhook-signature matches");
}
