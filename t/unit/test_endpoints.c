/*
 * Unit tests of an endpoint's body checks (app/server/endpoints.c): the URL,
 * a filter_types entry and a given secret, each at its bounds. The routes
 * themselves are t/e2e/test_endpoints.c's.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "server/endpoints.h"

Test(endpoint_checks, urls_are_http_or_https_with_a_host_in_printable_ascii)
{
	static const char *const good[] = { "https://h", "http://10.0.0.1:8080/x?y=1#z",
		                            "https://user@h/%20", "https://[::1]:1/" };
	static const char *const bad[] = { "",
		                           "https://",
		                           "https:///x",
		                           "http://?x",
		                           "http://#",
		                           "ftp://h",
		                           "HTTP://h",
		                           "https:/h",
		                           "https://h/ ",
		                           "https://h\t/",
		                           "https://h/\xc3\xa9" };
	char detail[256], url[2100];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert_eq(endpoints_check_url(good[i], detail, sizeof(detail)), 0, "%s: %s",
		             good[i], detail);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(endpoints_check_url(bad[i], detail, sizeof(detail)), -1, "%s", bad[i]);
	/* 2048 bytes, then 2049. */
	memset(url, 'a', sizeof(url));
	memcpy(url, "https://", 8);
	url[2048] = '\0';
	cr_assert_eq(endpoints_check_url(url, detail, sizeof(detail)), 0, "%s", detail);
	url[2048] = 'a';
	url[2049] = '\0';
	cr_assert_eq(endpoints_check_url(url, detail, sizeof(detail)), -1);
	cr_assert_str_eq(detail, "\"url\" must be 1 to 2048 bytes long");
}

Test(endpoint_checks, a_filter_entry_is_a_type_or_a_glob_of_one)
{
	static const char *const good[] = { "workflow.created", "workflow.*", "job.completed", "a",
		                            "A-b_9.*",          "x.y.z.*" };
	static const char *const bad[] = { "",           "*",    ".*",    "workflow.",
		                           ".created",   "a..b", "work*", "a.*.b",
		                           "a b",        "a.**", "a/b",   "endpoint.disabled",
		                           "delivery.*", "é" };
	char detail[256], name[200];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert_eq(endpoints_check_type(good[i], detail, sizeof(detail)), 0, "%s: %s",
		             good[i], detail);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(endpoints_check_type(bad[i], detail, sizeof(detail)), -1, "%s",
		             bad[i]);
	/* "endpointx.y" is a tenant's own type. */
	cr_assert_eq(endpoints_check_type("endpoints.x", detail, sizeof(detail)), 0);
	memset(name, 'a', sizeof(name));
	name[128] = '\0';
	cr_assert_eq(endpoints_check_type(name, detail, sizeof(detail)), 0);
	name[128] = 'a';
	name[129] = '\0';
	cr_assert_eq(endpoints_check_type(name, detail, sizeof(detail)), -1);
}

Test(endpoint_checks, a_given_secret_is_whsec_and_24_to_64_bytes_of_base64)
{
	/* base64 of 24, 32 and 64 bytes; 23 and 65 bytes; bad padding and
	 * characters. */
	static const char *const good[] = {
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oDC2FVsBQIhrs=",
		"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
	};
	static const char *const bad[] = {
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS=",
		"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa-w",
		"whsec_MfKQ9r8GKYqrTwjUPD8IL=ZIo2LaLaSw",
		"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"whsec_",
		"whsec_====",
	};
	char detail[256];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert_eq(endpoints_check_secret(good[i], detail, sizeof(detail)), 0, "%s: %s",
		             good[i], detail);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(endpoints_check_secret(bad[i], detail, sizeof(detail)), -1, "%s",
		             bad[i]);
}
