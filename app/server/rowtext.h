/*
 * rowtext.h - a command's rows as a partition hands them back through a
 * PL/Proxy proxy (sql/027_partition_keyed_commands.sql): a JSON array of
 * PostgreSQL record texts, one per row, such as
 *
 *   ["(,,5,\"a b\",t)"]
 *
 * read back into a PGresult of text columns, which a command's render
 * reads as it reads the database's own result: the same values as text,
 * NULL where the record has nothing between its commas.
 */
#ifndef IDF_ROWTEXT_H
#define IDF_ROWTEXT_H

#include <stddef.h>

#include <libpq-fe.h>

#include "core/err.h"

/* At most this many columns in a row. */
#define ROWTEXT_MAX_FIELDS 128

/*
 * The rows in json (len bytes) as a PGresult (PQclear() it), with as many
 * columns as the first row has (none without a row). NULL with e filled
 * (ERR_INTERNAL) when json is not such an array, or two rows differ in
 * their number of fields.
 */
PGresult *rowtext_result(const char *json, size_t len, struct err *e);

#endif
