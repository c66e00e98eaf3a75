"""Connects to a Retina node with the ADBC Flight SQL driver, runs queries, reads the
metadata drivers read, and hands a result to DuckDB. Usage: flight_sql.py HOST:PORT TOKEN
ACCOUNTS ENTRIES
"""

import sys

import adbc_driver_flightsql.dbapi as flightsql
import duckdb

OPENING = 1000


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def connect(addr, token):
    return flightsql.connect(
        f"grpc://{addr}",
        db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {token}"},
    )


def main():
    addr, token = sys.argv[1], sys.argv[2]
    accounts, entries = int(sys.argv[3]), int(sys.argv[4])

    try:
        with connect(addr, "wrong") as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchall()
        fail("a wrong token was accepted")
    except flightsql.Error as e:
        if "token" not in str(e).lower() and "unauthenticated" not in str(e).lower():
            fail(f"a wrong token fails unclearly: {e}")

    with connect(addr, token) as conn:
        info = conn.adbc_get_info()
        if info.get("vendor_name") != "Retina":
            fail(f"GetSqlInfo: {info}")

        objects = conn.adbc_get_objects().read_all().to_pylist()
        seen = {
            (c["catalog_name"], s["db_schema_name"], t["table_name"])
            for c in objects
            for s in c["catalog_db_schemas"] or []
            for t in s["db_schema_tables"] or []
        }
        for table in ["accounts", "ledger"]:
            if ("retina", "bank", table) not in seen:
                fail(f"GetTables misses retina.bank.{table}: {seen}")
        schema = conn.adbc_get_table_schema("accounts", db_schema_filter="bank")
        if schema.names != ["id", "owner", "balance"]:
            fail(f"the schema of bank.accounts: {schema}")

        with conn.cursor() as cur:
            cur.execute("SELECT count(*) AS n, sum(balance) AS total FROM bank.accounts")
            n, total = cur.fetchone()
            if (n, total) != (accounts, accounts * OPENING):
                fail(f"count and sum: {(n, total)}")
            cur.execute("SELECT count(*) FROM retina.bank.ledger")
            if cur.fetchone()[0] != entries:
                fail("the ledger's count through the catalog's name")

            # A join of both tables at one snapshot: what left each account is in the ledger.
            cur.execute(
                "SELECT a.id, a.balance, coalesce(i.amount, 0) - coalesce(o.amount, 0) AS moved "
                "FROM bank.accounts a "
                "LEFT JOIN (SELECT dst, sum(amount) AS amount FROM bank.ledger GROUP BY dst) i "
                "ON i.dst = a.id "
                "LEFT JOIN (SELECT src, sum(amount) AS amount FROM bank.ledger GROUP BY src) o "
                "ON o.src = a.id"
            )
            for id_, balance, moved in cur.fetchall():
                if balance != OPENING + moved:
                    fail(f"account {id_}: {balance} against {moved} moved")

            # A prepared statement (as JDBC runs every statement), and a result's schema
            # without running it.
            sql = "SELECT id, balance FROM bank.accounts WHERE id <= 3 ORDER BY id"
            cur.adbc_prepare(sql)
            cur.execute(sql)
            if [r[0] for r in cur.fetchall()] != [1, 2, 3]:
                fail("a prepared statement's rows")
            schema = cur.adbc_execute_schema(sql)
            if schema.names != ["id", "balance"]:
                fail(f"the schema of a statement: {schema}")

            # DuckDB reads the Arrow result.
            cur.execute("SELECT id, owner, balance FROM bank.accounts")
            result = cur.fetch_arrow_table()
            top = duckdb.sql(
                "SELECT id, balance FROM result ORDER BY balance DESC, id LIMIT 3"
            ).fetchall()
            rows = sorted(
                ((r["id"], r["balance"]) for r in result.to_pylist()),
                key=lambda r: (-r[1], r[0]),
            )[:3]
            if top != rows:
                fail(f"DuckDB's top three {top}, pyarrow's {rows}")

            # Anything but a query is refused, clearly.
            for statement in ["DELETE FROM bank.accounts", "CREATE TABLE x (a INT)"]:
                try:
                    cur.execute(statement)
                    cur.fetchall()
                    fail(f"`{statement}` was accepted")
                except flightsql.Error as e:
                    if "SELECT only" not in str(e):
                        fail(f"`{statement}` fails unclearly: {e}")
    print("ok")


if __name__ == "__main__":
    main()
