//! SQL on the replication connection before it streams: the publication's tables, the slot,
//! the catalog read from Postgres, and the consistent copy of the tables.

use pgwire_replication::{Lsn, QueryRow, ReplicationClient};

use super::spec::PostgresSpec;

/// `"name"`, quoted for SQL.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, quoted for SQL.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A replication connection that has not started streaming yet, on a runtime of its own: one
/// worker thread (`retina-pg`) runs the connection (keepalives, status updates) whatever the
/// sink's thread is doing; the sink's thread blocks on its events.
pub(crate) struct Session {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) client: ReplicationClient,
    spec: PostgresSpec,
}

impl Session {
    /// Connects and authenticates; streaming starts at `start` (zero: where the slot's
    /// confirmed position is), reporting `ack` as flushed until told more.
    pub(crate) fn connect(spec: &PostgresSpec, start: Lsn, ack: Lsn) -> Result<Session, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("retina-pg")
            .enable_all()
            .build()
            .map_err(|e| format!("{spec}: a runtime for the connection: {e}"))?;
        let cfg = spec
            .config()?
            .with_start_lsn(start)
            .with_ack_lsn(ack)
            // A standby status update at least this often, whatever the stream does.
            .with_status_interval(std::time::Duration::from_secs(1))
            .with_buffer_size(8192);
        let client = {
            let _guard = rt.enter();
            rt.block_on(ReplicationClient::connect_gated(cfg))
                .map_err(|e| format!("{spec}: {e}"))?
        };
        Ok(Session {
            rt,
            client,
            spec: spec.clone(),
        })
    }

    /// Runs `sql`; its rows, each value's text (`None`: NULL).
    pub(crate) fn query(&mut self, sql: &str) -> Result<Vec<QueryRow>, String> {
        let Session { rt, client, spec } = self;
        rt.block_on(client.simple_query(sql))
            .map_err(|e| format!("{spec}: {e} (running `{}`)", first_words(sql)))
    }

    /// The first row's first value of `sql`, as text.
    pub(crate) fn value(&mut self, sql: &str) -> Result<Option<String>, String> {
        Ok(self.query(sql)?.first().and_then(|row| column_text(row, 0)))
    }

    /// Refuses a server older than PostgreSQL 15 (the first run's `SNAPSHOT 'use'` and the
    /// publication's row filters need it).
    pub(crate) fn check_version(&mut self) -> Result<(), String> {
        let version = self.value("SHOW server_version_num")?.unwrap_or_default();
        match version.parse::<u32>() {
            Ok(v) if v >= 150_000 => Ok(()),
            _ => Err(format!(
                "{}: PostgreSQL {version} is older than 15, which the source needs",
                self.spec
            )),
        }
    }

    /// The server's current WAL position.
    pub(crate) fn wal_position(&mut self) -> Result<Lsn, String> {
        let Session { rt, client, spec } = self;
        rt.block_on(client.identify_system())
            .map(|s| s.xlogpos)
            .map_err(|e| format!("{spec}: IDENTIFY_SYSTEM: {e}"))
    }

    /// Whether the publication exists (an error names it when it does not).
    pub(crate) fn check_publication(&mut self) -> Result<(), String> {
        let exists = self.value(&format!(
            "SELECT 1 FROM pg_publication WHERE pubname = {}",
            literal(&self.spec.publication)
        ))?;
        match exists {
            Some(_) => Ok(()),
            None => Err(format!(
                "{}: publication `{}` does not exist (CREATE PUBLICATION {} FOR TABLE ...)",
                self.spec,
                self.spec.publication,
                ident(&self.spec.publication)
            )),
        }
    }

    /// The slot's plugin, if the slot exists.
    pub(crate) fn slot_plugin(&mut self) -> Result<Option<String>, String> {
        self.value(&format!(
            "SELECT coalesce(plugin, '') FROM pg_replication_slots WHERE slot_name = {}",
            literal(&self.spec.slot)
        ))
    }

    /// The publication's tables, `(schema, table, row filter)`, in name order (the filter:
    /// the publication's `WHERE`, empty for none).
    pub(crate) fn publication_tables(&mut self) -> Result<Vec<(String, String, String)>, String> {
        let rows = self.query(&format!(
            "SELECT schemaname, tablename, coalesce(rowfilter, '') FROM pg_publication_tables \
             WHERE pubname = {} ORDER BY 1, 2",
            literal(&self.spec.publication)
        ))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let text = |i| column_text(&r, i).unwrap_or_default();
                (text(0), text(1), text(2))
            })
            .collect())
    }

    /// Starts streaming and waits until the server holds the slot for this session.
    pub(crate) fn start(mut self) -> Result<Streaming, String> {
        let Session { rt, client, spec } = &mut self;
        rt.block_on(async {
            client.start().await?;
            client.wait_started().await
        })
        .map_err(|e| format!("{spec}: START_REPLICATION: {e}"))?;
        Ok(Streaming {
            rt: self.rt,
            client: self.client,
        })
    }
}

/// A replication connection that streams.
pub(crate) struct Streaming {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) client: ReplicationClient,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let Streaming { rt, client } = self;
        // Ends the session cleanly (CopyDone); the slot becomes free for the next run.
        let _ = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(2), client.shutdown()).await
        });
    }
}

/// Column `i` of a result row as text (`None`: NULL or no such column).
pub(crate) fn column_text(row: &QueryRow, i: usize) -> Option<String> {
    row.get(i)?
        .as_ref()
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

fn first_words(sql: &str) -> String {
    let one_line = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &one_line[..i]),
        None => one_line,
    }
}

/// A table's qualified name, its column definitions, and its key columns by key position.
type TableDdl = (String, Vec<String>, Vec<(i64, String)>);

/// A catalog's `CREATE TABLE` statements for the publication's tables as Postgres defines them,
/// or why a table cannot be held (a type the lake has no column for, no primary key).
pub(crate) fn catalog_ddl(session: &mut Session) -> Result<String, String> {
    let spec = session.spec.clone();
    let rows = session.query(&format!(
        "SELECT n.nspname, c.relname, a.attname, a.atttypid, a.atttypmod, \
                format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                coalesce((SELECT k.n FROM unnest(i.indkey) WITH ORDINALITY k(att, n) \
                          WHERE k.att = a.attnum), 0) \
         FROM pg_publication_tables pt \
         JOIN pg_namespace n ON n.nspname = pt.schemaname \
         JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename \
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
              AND a.attname = ANY(pt.attnames) \
         LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary \
         WHERE pt.pubname = {} \
         ORDER BY n.nspname, c.relname, a.attnum",
        literal(&spec.publication)
    ))?;
    if rows.is_empty() {
        return Err(format!(
            "{spec}: publication `{}` has no tables",
            spec.publication
        ));
    }
    let mut tables: Vec<TableDdl> = Vec::new();
    for row in rows {
        let text = |i| column_text(&row, i).unwrap_or_default();
        let table = format!("{}.{}", ident(&text(0)), ident(&text(1)));
        let column = text(2);
        let (oid, typmod) = (
            text(3).parse::<u32>().unwrap_or(0),
            text(4).parse::<i32>().unwrap_or(-1),
        );
        let ty = ddl_type(oid, typmod).map_err(|why| {
            format!(
                "{spec}: table {}.{}, column `{column}` of type {}: {why}; declare the tables \
                 with --schema instead, or leave the column out",
                text(0),
                text(1),
                text(5)
            )
        })?;
        let not_null = if text(6) == "t" { " NOT NULL" } else { "" };
        if tables.last().is_none_or(|t| t.0 != table) {
            tables.push((table.clone(), Vec::new(), Vec::new()));
        }
        let t = tables.last_mut().expect("pushed");
        t.1.push(format!("{} {ty}{not_null}", ident(&column)));
        let key_at: i64 = text(7).parse().unwrap_or(0);
        if key_at > 0 {
            t.2.push((key_at, ident(&column)));
        }
    }
    let mut ddl = String::new();
    for (name, mut columns, mut key) in tables {
        if key.is_empty() {
            return Err(format!(
                "{spec}: table {name} has no primary key; Retina replays by primary key \
                 (declare one with --schema, naming columns that identify a row, and set \
                 REPLICA IDENTITY FULL)"
            ));
        }
        key.sort();
        let key: Vec<String> = key.into_iter().map(|(_, c)| c).collect();
        columns.push(format!("PRIMARY KEY ({})", key.join(", ")));
        ddl += &format!("CREATE TABLE {name} (\n  {}\n);\n", columns.join(",\n  "));
    }
    Ok(ddl)
}

/// The catalog type holding a Postgres type (by oid and modifier).
fn ddl_type(oid: u32, typmod: i32) -> Result<String, String> {
    Ok(match oid {
        16 => "BOOLEAN".into(),
        21 | 23 => "INTEGER".into(),
        20 => "BIGINT".into(),
        700 => "REAL".into(),
        701 => "DOUBLE PRECISION".into(),
        1700 if typmod >= 4 => {
            // The scale is an 11-bit signed field (Postgres 15 allows it negative, or above
            // the precision).
            let precision = ((typmod - 4) >> 16) & 0xffff;
            let scale = (((typmod - 4) & 0x7ff) ^ 0x400) - 0x400;
            if precision > 38 {
                return Err(format!("precision {precision} is beyond 38 digits"));
            }
            if scale < 0 || scale > precision {
                return Err(format!(
                    "numeric({precision},{scale}): the scale must be 0 to the precision"
                ));
            }
            format!("DECIMAL({precision},{scale})")
        }
        1700 => return Err("numeric without a precision has no fixed scale".into()),
        // text, varchar, char, name, uuid, json, jsonb: their text.
        25 | 1043 | 1042 | 19 | 2950 | 114 | 3802 => "TEXT".into(),
        1082 => "DATE".into(),
        1114 => "TIMESTAMP".into(),
        1184 => "TIMESTAMP WITH TIME ZONE".into(),
        1083 => "TIME".into(),
        _ => return Err("the lake has no column type for it".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(first_words("SELECT  1\n FROM x"), "SELECT 1 FROM x");
    }

    #[test]
    fn types_map() {
        // numeric(10,2): typmod ((10 << 16) | 2) + 4.
        assert_eq!(ddl_type(1700, (10 << 16 | 2) + 4).unwrap(), "DECIMAL(10,2)");
        assert!(
            ddl_type(1700, -1)
                .unwrap_err()
                .contains("without a precision")
        );
        assert!(
            ddl_type(1700, (60 << 16) + 4)
                .unwrap_err()
                .contains("beyond 38")
        );
        // numeric(5,-2): the scale's 11 bits hold -2.
        let negative = ((5 << 16) | (-2i32 & 0x7ff)) + 4;
        assert!(
            ddl_type(1700, negative)
                .unwrap_err()
                .contains("numeric(5,-2)")
        );
        assert_eq!(ddl_type(1043, 24).unwrap(), "TEXT");
        assert!(ddl_type(17, -1).unwrap_err().contains("no column type"));
        // Every type the mapping names is one the catalog parses.
        let columns: Vec<String> = [16, 21, 23, 20, 700, 701, 25, 1082, 1114, 1184, 1083]
            .iter()
            .enumerate()
            .map(|(i, &oid)| format!("c{i} {}", ddl_type(oid, -1).unwrap()))
            .collect();
        let ddl = format!(
            "CREATE TABLE \"s\".\"t\" ({}, PRIMARY KEY (c1));",
            columns.join(", ")
        );
        crate::catalog::Catalog::from_ddl(&ddl, "pg").unwrap();
    }
}
