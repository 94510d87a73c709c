/*
 * rowtext.h - a command's rows as a partition hands them back through a
 * PL/Proxy proxy (sql/032_partition_waits_and_names.sql): the columns'
 * names and a PostgreSQL record text per row, such as
 *
 *   {"columns":["problem","detail","n","s","ok"],"rows":["(,,5,\"a b\",t)"]}
 *
 * read back into a PGresult of text columns of those names, which a
 * command's render reads as it reads the database's own result: the same
 * values as text, NULL where the record has nothing between its commas.
 */
#ifndef IDF_ROWTEXT_H
#define IDF_ROWTEXT_H

#include <stddef.h>

#include <libpq-fe.h>

#include "core/err.h"

/* At most this many columns in a row. */
#define ROWTEXT_MAX_FIELDS 128

/*
 * The rows in json (len bytes) as a PGresult (PQclear() it), with the
 * columns named (none without a row). NULL with e filled (ERR_INTERNAL)
 * when json is not such an object, or a row's number of fields is not
 * the number of columns.
 */
PGresult *rowtext_result(const char *json, size_t len, struct err *e);

#endif
