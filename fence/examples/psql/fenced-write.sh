#!/bin/sh
# fenced-write.sh KEY VALUE: writes VALUE under KEY in the table
# fenced_example of a PostgreSQL database, fenced by the lock the caller
# holds: the write is refused, and changes nothing, once a later holder of
# the lock (a greater token) has written.
#
# Run it under a command that holds a lock and passes its fencing token:
#
#   redlockrun -addrs r1:6379,r2:6379,r3:6379 nightly -- ./fenced-write.sh report done
#   natslock -start 'LOCK_NAME=KEY ./fenced-write.sh leader "$(hostname)"' URL BUCKET KEY TOKEN
#
# redlockrun gives COMMAND LOCK_NAME and LOCK_TOKEN; natslock gives its
# start command the token as $1, NATSLOCK_TOKEN and LOCK_TOKEN, but not
# the key: set LOCK_NAME to it there, as above. amqpsem acquire passes
# LOCK_TOKEN=0: it makes no fencing tokens, and this script refuses token
# 0, as every guard of module fence does.
#
# The database is psql's: DATABASE_URL if set, else the PG* variables.
# The fence is the table of Go's sqlfence guard (latchkey_fence, one row
# per lock name with the largest token that has written), so a Go writer
# through sqlfence and this script fence each other. The raise of the
# fence row and the data write are one transaction: the raise locks the
# row until the commit, so a later holder's raise waits for it, then sees
# its token (the same argument as sqlfence's).
#
# Exit codes: 0 written; 5 stale (a later holder has written: nothing
# changed); 65 no fencing token (LOCK_TOKEN 0); 64 usage; 1 other errors.
set -eu

if [ $# -ne 2 ]; then
	echo "usage: fenced-write.sh KEY VALUE (with LOCK_NAME and LOCK_TOKEN set)" >&2
	exit 64
fi
name=${LOCK_NAME:-}
token=${LOCK_TOKEN:-}
if [ -z "$name" ]; then
	echo "fenced-write.sh: LOCK_NAME is not set" >&2
	exit 64
fi
case $token in
'' | *[!0-9]*)
	echo "fenced-write.sh: LOCK_TOKEN=\"$token\" is not a fencing token" >&2
	exit 64
	;;
esac
if [ "$token" -eq 0 ]; then
	echo "fenced-write.sh: $name: token 0: the lock's backend makes no fencing tokens" >&2
	exit 65
fi

# psql prints one line: "written NEWEST" or "stale NEWEST".
out=$(psql ${DATABASE_URL:+"$DATABASE_URL"} -X -q -A -t -v ON_ERROR_STOP=1 \
	-v name="$name" -v token="$token" -v key="$1" -v value="$2" <<'SQL'
CREATE TABLE IF NOT EXISTS latchkey_fence (name BYTEA PRIMARY KEY, token BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS fenced_example (key TEXT PRIMARY KEY, value TEXT NOT NULL, token BIGINT NOT NULL);
BEGIN;
-- Raise the name's fence to our token unless a greater one has written;
-- the row stays locked until COMMIT or ROLLBACK.
WITH raised AS (
	INSERT INTO latchkey_fence AS f (name, token)
	VALUES (convert_to(:'name', 'UTF8'), :'token'::BIGINT)
	ON CONFLICT (name) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
	RETURNING 1
)
SELECT count(*) > 0 AS fresh FROM raised \gset
\if :fresh
	INSERT INTO fenced_example (key, value, token) VALUES (:'key', :'value', :'token'::BIGINT)
	ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token;
	COMMIT;
	SELECT 'written ' || :'token';
\else
	ROLLBACK;
	SELECT 'stale ' || token FROM latchkey_fence WHERE name = convert_to(:'name', 'UTF8');
\endif
SQL
)
case $out in
written*)
	echo "fenced-write.sh: $name: wrote $1 with token $token"
	;;
stale*)
	echo "fenced-write.sh: $name: token $token is stale: token ${out#stale } has written; nothing changed" >&2
	exit 5
	;;
*)
	echo "fenced-write.sh: unexpected output from psql: $out" >&2
	exit 1
	;;
esac
