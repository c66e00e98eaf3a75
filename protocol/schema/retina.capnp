@0xe7c06e87db260674;

# Retina's query contract: how a query engine reads fresh, transactionally consistent tables.
#
# A client bootstraps on the coordinator's address, begins a query (a snapshot and a lease),
# asks for a table's scan plan at that snapshot, reads the plan's Parquet files from the object
# store itself, asks each owner shard's scan service for the visibility bitmaps of the row
# groups it reads and for the shard's write buffer, applies VFoR (skip row groups whose
# minCreateTs > snapshot, keep rows with _create_ts <= snapshot where maxCreateTs > snapshot,
# drop rows whose bitmap bit is set), and ends the query. A query that is neither renewed nor
# ended within its lease is ended for it.
#
# Conventions: timestamps are UInt64 (never 0); a bitmap is little-endian UInt64 words, bit i
# of the words = row offset+i, 1 = deleted at the snapshot; Arrow data is an Arrow IPC stream
# of the table's stored schema (its columns, then `_create_ts` as Int64). Every call that can
# fail returns a result union with a typed Error, never a bare string.

struct Error {
  union {
    unknownTable @0 :Text;
    snapshotTooOld :group {
      # Visibility was folded past the snapshot: begin a new query.
      requested @1 :UInt64;
      oldest @2 :UInt64;
    }
    snapshotInFuture :group {
      requested @3 :UInt64;
      appliedThrough @4 :UInt64;
    }
    leaseExpired @5 :UInt64;      # the query id; begin a new query
    unknownFile @6 :UInt64;       # the file id; the file was rewritten: ask for a new plan
    unauthorized @7 :Void;        # a missing or wrong auth token
    wrongService @8 :Text;        # e.g. a scan service asked on the coordinator's port
    internal @9 :Text;            # a bug or an I/O failure on the node; the text says which
    invalidArgument @10 :Text;    # an argument out of range (a snapshot that is not a timestamp
                                  # or not the query's, a row group or column the table does not
                                  # have, a list over its bound); the text names it
    tooManyQueries @11 :UInt32;   # this connection (or the node) runs this many queries, its
                                  # limit: end one first
    catchingUp :group {
      # The node is still replaying what its source held when it started (after a restart:
      # its HWM is not yet back at the snapshot queries saw before); the begin waited
      # query_wait_ms for it. Try again shortly.
      snapshot @12 :UInt64;       # the newest snapshot it could hand out now
      target @13 :UInt64;         # the snapshot it waits for; 0 while not known yet
    }
  }
}

enum ColumnType {
  boolean @0;
  int32 @1;
  int64 @2;
  float32 @3;
  float64 @4;
  decimal @5;     # Decimal128 with precision and scale
  utf8 @6;
  date @7;        # days since 1970-01-01
  timestamp @8;   # microseconds since 1970-01-01T00:00:00Z
  time @9;        # microseconds since midnight
  timestampTz @10; # microseconds since 1970-01-01T00:00:00Z, an instant (Arrow: UTC)
}

struct Column {
  name @0 :Text;
  type @1 :ColumnType;
  precision @2 :UInt8;   # decimal only
  scale @3 :Int8;        # decimal only
  nullable @4 :Bool;
}

struct Table {
  id @0 :UInt32;
  name @1 :Text;
  columns @2 :List(Column);
  primaryKey @3 :List(UInt16);   # column positions
}

struct Query {
  id @0 :UInt64;
  snapshot @1 :UInt64;   # HWM - 1 when the query began
  leaseMs @2 :UInt64;    # renew before this many milliseconds pass
  secret @3 :UInt64;     # presented with the id to the scan services; only the connection
                         # that began the query may renew, end or plan it
}

struct RowGroup {
  offset @0 :UInt64;     # of its first row in the file
  rows @1 :UInt64;
  minCreateTs @2 :UInt64;
  maxCreateTs @3 :UInt64;
}

struct Endpoint {
  shard @0 :UInt16;
  address @1 :Text;      # host:port of the shard's scan service
}

struct PlanFile @0xf2670c746de4a030 {  # the type ID of its first name, FileEntry
  fileId @0 :UInt64;
  path @1 :Text;         # in the object store
  owner @2 :Endpoint;    # the shard that answers bitmaps for it
  rowGroups @3 :List(RowGroup);
  bytes @4 :UInt64;      # the object's size, so a reader can fetch its footer directly
}

struct ScanPlan {
  table @0 :Table;
  snapshot @1 :UInt64;
  files @2 :List(PlanFile);    # regular Parquet files
  buffers @3 :List(Endpoint);  # shards whose write buffers hold rows of the table
  storeUrl @4 :Text;           # where the paths are: `file:///dir/` or `s3://bucket/prefix/`
}

struct RowGroupBitmap @0xaf55cb8c6e1c3624 {  # the type ID of its first name, Bitmap
  rowGroup @0 :UInt32;
  rows @1 :UInt64;
  deleted @2 :Data;
}

# A piece of a shard's write buffer (or a file the shard combined after the plan was made).
struct BufferPart {
  fileId @0 :UInt64;
  offset @1 :UInt64;     # of the part's first row in its file
  rows @2 :UInt64;
  deleted @3 :Data;      # bitmap of the part's rows at the snapshot
  union {
    memory @4 :Data;     # Arrow IPC stream: the rows, with _create_ts
    path @5 :Text;       # a Parquet object to read (a flushed block or a newly combined file)
  }
  # What the node knows of a path's object, so a reader can skip work; absent where it is not
  # known (a block flushed before the node restarted).
  bytes @6 :UInt64;      # the object's size; 0 = not known (the reader asks the store)
  maxCreateTs @7 :UInt64 = 0xffffffffffffffff;
                         # the newest _create_ts of its rows: a snapshot at or after it sees
                         # every row the bitmap keeps; the default = not known
}

struct QueryResult {
  union {
    ok @0 :Query;
    error @1 :Error;
  }
}

struct Done {
  union {
    ok @0 :Void;
    error @1 :Error;
  }
}

struct ScanPlanResult {
  union {
    ok @0 :ScanPlan;
    error @1 :Error;
  }
}

struct BitmapsResult {
  union {
    ok @0 :List(RowGroupBitmap);
    error @1 :Error;
  }
}

# One file's row groups in a fileBitmaps call.
struct FileRowGroups {
  fileId @0 :UInt64;
  rowGroups @1 :List(UInt32);
}

# One file's answer in a fileBitmaps call: what bitmaps answers for it.
struct FileBitmaps {
  fileId @0 :UInt64;
  bitmaps @1 :List(RowGroupBitmap);
}

struct FileBitmapsResult {
  union {
    ok @0 :List(FileBitmaps);    # the files in the order asked
    error @1 :Error;             # the first file's error (e.g. unknownFile), or the call's
  }
}

struct BufferResult {
  union {
    ok @0 :List(BufferPart);
    error @1 :Error;
  }
}

struct CoordinatorResult {
  union {
    ok @0 :Coordinator;
    error @1 :Error;
  }
}

struct ScanServiceResult {
  union {
    ok @0 :ScanService;
    error @1 :Error;
  }
}

# What every Retina port serves first. The auth token is checked here; a node that listens
# only on loopback accepts an empty token.
interface Bootstrap {
  coordinator @0 (authToken :Text) -> (result :CoordinatorResult);
  scanService @1 (authToken :Text) -> (result :ScanServiceResult);
}

# A query belongs to the connection that began it: renewLease, endQuery and scanPlan on any
# other connection answer leaseExpired, and its queries end when it closes. A connection runs at
# most 256 queries at once, the node 16,384 (tooManyQueries beyond).
interface Coordinator {
  beginQuery @0 () -> (result :QueryResult);
  endQuery @1 (queryId :UInt64) -> (result :Done);
  renewLease @2 (queryId :UInt64) -> (result :QueryResult);
  listTables @3 () -> (tables :List(Table));
  scanPlan @4 (queryId :UInt64, table :Text) -> (result :ScanPlanResult);
  # beginQuery and a scanPlan of each of `tables` at the new query's snapshot, in one round
  # trip: `plans` answers each table in the order asked (each its own result, as scanPlan's:
  # an unknown table is unknownTable there and the query still begins), and is empty when the
  # begin is refused. At most 256 tables (invalidArgument beyond, and no query begins).
  beginQueryAndPlan @5 (tables :List(Text)) -> (result :QueryResult, plans :List(ScanPlanResult));
}

# One per shard, beside it on its core.
#
# Every call names a running query (`queryId` and `secret` from beginQuery) and reads at that
# query's snapshot only: a query that ended or whose lease ran out is refused with leaseExpired,
# another snapshot with invalidArgument. Lists are bounded: at most 65,536 row groups per
# bitmaps call (duplicates are answered once), 65,536 known files; a memory part's Arrow data
# is at most 16 MiB (a larger block comes as several parts, each with its own offset, rows and
# bitmap).
interface ScanService {
  # Bitmaps of a regular file's row groups at a snapshot.
  bitmaps @0 (fileId :UInt64, snapshot :UInt64, rowGroups :List(UInt32), queryId :UInt64, secret :UInt64) -> (result :BitmapsResult);
  # Bitmaps of several regular files' row groups at a snapshot, in one call: for each file what
  # bitmaps answers. The row-group bound counts the row groups of all files together.
  fileBitmaps @2 (files :List(FileRowGroups), snapshot :UInt64, queryId :UInt64, secret :UInt64) -> (result :FileBitmapsResult);
  # The shard's write buffer of a table at a snapshot. `knownFiles` are the regular files the
  # plan listed; a file this shard combined after the plan was made is returned as a part by
  # path, so that no row is missed or read twice.
  # `columns` (positions in the table, empty: all) projects memory parts' Arrow data to those
  # columns, in that order, then `_create_ts`.
  writeBuffer @1 (table :UInt32, snapshot :UInt64, knownFiles :List(UInt64), queryId :UInt64, secret :UInt64, columns :List(UInt16)) -> (result :BufferResult);
}
