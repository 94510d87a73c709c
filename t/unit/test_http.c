/* test_http.c - the HTTP view of a request: status lines and the
 * Idempotency-Key header. */
#include <criterion/criterion.h>
#include <string.h>

#include "server/http.h"

/* Every status the API or its problems answer, with RFC 9110's reason
 * phrase (section 15): nginx passes "Status: NNN Reason" on verbatim. */
Test(http, every_status_has_its_rfc9110_reason)
{
	static const struct {
		int status;
		const char *reason;
	} want[] = {
		{ 200, "OK" },
		{ 201, "Created" },
		{ 202, "Accepted" },
		{ 204, "No Content" },
		{ 400, "Bad Request" },
		{ 401, "Unauthorized" },
		{ 403, "Forbidden" },
		{ 404, "Not Found" },
		{ 405, "Method Not Allowed" },
		{ 409, "Conflict" },
		{ 413, "Content Too Large" },
		{ 415, "Unsupported Media Type" },
		{ 422, "Unprocessable Content" },
		{ 500, "Internal Server Error" },
		{ 503, "Service Unavailable" },
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert_str_eq(http_reason(want[i].status), want[i].reason, "status %d",
		                 want[i].status);
}
