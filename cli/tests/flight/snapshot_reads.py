"""Reads a Retina node over Arrow Flight with pyarrow while it replays a stream of transfers.

Every read takes both tables of one FlightInfo (one query, one snapshot) and checks the
cross-table invariant: each account's balance is its opening balance plus what the ledger
moved in, minus what it moved out. A read that saw one table of a transaction and not the
other fails it. Usage: snapshot_reads.py HOST:PORT TOKEN DONE_FILE
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

OPENING = 1000


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def read_info(client, options, info):
    """Every endpoint of `info`, each table's batches together: {table: pyarrow.Table}."""
    parts = {}
    queries = set()
    for endpoint in info.endpoints:
        meta = json.loads(endpoint.app_metadata)
        queries.add(meta["query"])
        table = client.do_get(endpoint.ticket, options).read_all()
        parts.setdefault(meta["table"], []).append(table)
    if len(queries) != 1:
        fail(f"the endpoints of one FlightInfo belong to queries {queries}")
    return {name: pa.concat_tables(tables) for name, tables in parts.items()}


def check(tables, snapshot):
    accounts = tables["bank.accounts"].to_pylist()
    ledger = tables["bank.ledger"].to_pylist()
    moved = {}
    for e in ledger:
        moved[e["src"]] = moved.get(e["src"], 0) - e["amount"]
        moved[e["dst"]] = moved.get(e["dst"], 0) + e["amount"]
    for a in accounts:
        expected = OPENING + moved.get(a["id"], 0)
        if a["balance"] != expected:
            fail(
                f"snapshot {snapshot}: account {a['id']} has {a['balance']}, the ledger says "
                f"{expected} ({len(ledger)} entries): a partial transaction"
            )
    ids = [a["id"] for a in accounts]
    if len(ids) != len(set(ids)):
        fail(f"snapshot {snapshot}: an account appears twice")
    return len(accounts), len(ledger)


def main():
    addr, token, done_file = sys.argv[1], sys.argv[2], sys.argv[3]
    client = flight.connect(f"grpc://{addr}")
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])

    # No token, no data.
    try:
        list(client.list_flights())
        fail("a call without the token was answered")
    except flight.FlightUnauthenticatedError:
        pass

    # The tables, their columns without _create_ts, and a row estimate.
    listed = {tuple(i.descriptor.path): i for i in client.list_flights(options=options)}
    names = sorted(p[0].decode() if isinstance(p[0], bytes) else p[0] for p in listed)
    if names != ["bank.accounts", "bank.ledger"]:
        fail(f"ListFlights lists {names}")
    for info in listed.values():
        if "_create_ts" in info.schema.names:
            fail(f"ListFlights shows _create_ts: {info.schema}")
    schema = client.get_schema(flight.FlightDescriptor.for_path("bank", "accounts"), options)
    if schema.schema.names != ["id", "owner", "balance"]:
        fail(f"GetSchema of bank.accounts: {schema.schema}")

    # An unknown table is a clear error naming the tables there are.
    try:
        client.get_flight_info(flight.FlightDescriptor.for_path("nope"), options)
        fail("an unknown table was planned")
    except pa.ArrowException as e:
        if "bank.accounts" not in str(e):
            fail(f"the error does not name the tables: {e}")

    both = flight.FlightDescriptor.for_path("bank.accounts", "bank", "ledger")
    reads, snapshots, last = 0, set(), 0
    total_sql = flight.FlightDescriptor.for_command(
        "SELECT sum(balance) AS total, count(*) AS n FROM bank.accounts"
    )
    final = False
    while True:
        if not final and os.path.exists(done_file):
            final = True
        info = client.get_flight_info(both, options)
        meta = json.loads(info.app_metadata)
        snapshot = meta["snapshot"]
        if snapshot < last:
            fail(f"time went backwards: snapshot {snapshot} after {last}")
        last = snapshot
        if meta["tables"] != ["bank.accounts", "bank.ledger"]:
            fail(f"FlightInfo tables {meta['tables']}")
        tables = read_info(client, options, info)
        accounts, entries = check(tables, snapshot)
        reads += 1
        snapshots.add(snapshot)

        # A ticket is read once.
        try:
            client.do_get(info.endpoints[0].ticket, options).read_all()
            fail("an endpoint was read twice")
        except pa.ArrowException:
            pass

        # SQL text at its own snapshot: money is only ever moved.
        sql = client.get_flight_info(total_sql, options)
        row = read_info_sql(client, options, sql)
        if row["n"] and row["total"] != row["n"] * OPENING:
            fail(f"SQL total {row} at snapshot {json.loads(sql.app_metadata)['snapshot']}")

        if final:
            expected = json.load(open(done_file))
            if entries == expected["entries"]:
                if accounts != expected["accounts"]:
                    fail(f"{accounts} accounts at the end, expected {expected['accounts']}")
                break
            time.sleep(0.05)
    print(json.dumps({"reads": reads, "snapshots": len(snapshots), "entries": entries}))


def read_info_sql(client, options, info):
    rows = []
    for endpoint in info.endpoints:
        rows += client.do_get(endpoint.ticket, options).read_all().to_pylist()
    return rows[0]


if __name__ == "__main__":
    main()
