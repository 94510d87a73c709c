/* sink.c - choosing the sink named by the configuration (see sink.h). */
#include "dispatch/sink.h"

#include <string.h>

struct sink *sink_open(const struct conf *c, struct err *e)
{
	if (strcmp(c->sink, "http") == 0)
		return sink_http_open(c, e);
	if (strcmp(c->sink, "amqp") == 0)
		return sink_amqp_open(c, e);
	if (strcmp(c->sink, "nats") == 0)
		return sink_nats_open(c, e);
	if (strcmp(c->sink, "exec") == 0)
		return sink_exec_open(c, e);
	err_set(e, ERR_CONFIG,
	        "invalid value \"%s\" for \"sink\": expected http, amqp, nats or exec", c->sink);
	return NULL;
}
