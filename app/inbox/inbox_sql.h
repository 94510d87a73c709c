/*
 * inbox_sql.h - sql/consumer/inbox.sql as a C string, made at build time
 * (app/inbox/inbox_sql.c), so that the library and consumers in other
 * languages run one definition of the inbox. Internal: not installed.
 */
#ifndef IDF_INBOX_SQL_H
#define IDF_INBOX_SQL_H

extern const char inbox_sql[];

#endif
