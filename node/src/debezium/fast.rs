//! The entry point of parsing a line ([`parse_line_with`]), and the common lines without a
//! DOM: a bare payload (`schemas.enable=false`) with `op` `c`, `r`, `u`, `d` or `t`, and a bare
//! BEGIN or END marker, read in one pass into the fields the parse needs, borrowing names and
//! column strings without escapes from the line. It answers only when the line is well formed
//! and every value converts; anything else (an envelope, a key written with escapes or twice,
//! a field of an unexpected type, any error) is left to the full parse in `message.rs`, which
//! gives the same result for the lines this one reads (tests check both agree) and the errors
//! with their exact texts.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use retina_storage::TableSchema;
use serde_json::Value as Json;

use super::error::{DebeziumError, SourcePosition};
use super::message::{
    ChangeEvent, ChangeOp, Message, TxnRef, json_u64, parse_full, shared_name, transaction_from,
    txn_id_owned,
};
use super::value::{Cell, Image, ParseOptions, Rows, key_only};

/// A row image: its columns as written, each with whether it was taken.
struct Columns<'a> {
    list: Vec<(&'a str, Cell<'a>, bool)>,
    /// Where the next column asked for probably is: events list columns in the table's order,
    /// which is the order they are asked for in.
    next: usize,
    taken: usize,
}

impl<'a> Columns<'a> {
    fn new(list: Vec<(&'a str, Cell<'a>, bool)>) -> Self {
        Columns {
            list,
            next: 0,
            taken: 0,
        }
    }

    /// The column's value, taken out (each column is read once): the first of its name not
    /// taken yet (see [`Self::took_the_last`] for names written twice).
    fn take(&mut self, name: &str) -> Option<Cell<'a>> {
        let i = match self.list.get(self.next) {
            Some((k, _, false)) if *k == name => self.next,
            _ => self
                .list
                .iter()
                .position(|(k, _, taken)| !taken && *k == name)?,
        };
        self.next = i + 1;
        self.taken += 1;
        let (_, cell, taken) = &mut self.list[i];
        *taken = true;
        Some(std::mem::replace(cell, Cell::Json(Cow::Owned(Json::Null))))
    }

    /// Whether every column taken was the last of its name, as in a JSON map (where a name
    /// written twice counts once, the last time): true unless a name taken is written again.
    fn took_the_last(&self) -> bool {
        // Looked for from the columns taken, which are few where a before image's key is all
        // that is read.
        self.taken == self.list.len()
            || !self
                .list
                .iter()
                .filter(|(_, _, taken)| *taken)
                .any(|(name, _, _)| self.list.iter().any(|(k, _, t)| !t && k == name))
    }
}

/// `source`: the names the parse reads.
#[derive(Default)]
struct Source<'a> {
    table: Option<&'a str>,
    schema: Option<&'a str>,
    db: Option<&'a str>,
    connector: Option<&'a str>,
}

/// A `source` block a thread read whole, and where its names are in it (table, schema, db,
/// connector): the read is a function of the block's bytes alone, so a block with the same
/// bytes has its names at the same places.
struct LastSource {
    block: Vec<u8>,
    names: [Option<Range<usize>>; 4],
}

/// The `source` blocks a thread remembers: the last [`LAST_SOURCES_KEPT`] (a stream's
/// transactions interleave a few tables). Where blocks do not repeat (Debezium's own carry an
/// event's `ts_ms`, `lsn` and `txId`), looking them up and keeping them only costs: after
/// [`MISSES_BEFORE_REST`] misses in a row the memory rests for [`REST_BLOCKS`] blocks, which
/// are read as if it were not there.
struct SourceMemory {
    known: Vec<LastSource>,
    misses: u32,
    resting: u32,
}

/// What the memory had for a `source` block.
enum Recall<'a> {
    /// Its length and names.
    Found(usize, Source<'a>),
    /// Nothing: the block is read, and kept.
    Missed,
    /// It was not looked for (the memory rests): the block is read, not kept.
    Resting,
}

const LAST_SOURCES_KEPT: usize = 8;
const MISSES_BEFORE_REST: u32 = 32;
const REST_BLOCKS: u32 = 4096;

thread_local! {
    static SOURCES: std::cell::RefCell<SourceMemory> = const {
        std::cell::RefCell::new(SourceMemory {
            known: Vec::new(),
            misses: 0,
            resting: 0,
        })
    };
}

/// A bare change event's payload: what the parse reads of it.
#[derive(Default)]
struct Payload<'a> {
    op: Option<&'a str>,
    before: Option<Columns<'a>>,
    after: Option<Columns<'a>>,
    source: Option<Source<'a>>,
    /// `None`: absent or null; `Some(None)`: a block without its three fields.
    transaction: Option<Option<TxnRef>>,
}

/// Parses one line of a Debezium JSON stream with the default [`ParseOptions`]; see
/// [`parse_line_with`].
pub fn parse_line(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
) -> Result<Message, DebeziumError> {
    parse_line_with(line, pos, catalog, &ParseOptions::default())
}

/// Parses one line of a Debezium JSON stream. `catalog` resolves a table name to its schema; it
/// is asked for `schema.table` (or `db.table`) first and then for the bare table name.
pub fn parse_line_with(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
    options: &ParseOptions,
) -> Result<Message, DebeziumError> {
    match parse_change(line, pos, catalog, options) {
        Some(m) => Ok(m),
        None => match parse_marker(line, pos) {
            Some(m) => Ok(m),
            None => parse_full(line, pos, catalog, options),
        },
    }
}

/// Reads `line` as a bare BEGIN or END marker that is well formed; `None` where the full parse
/// must decide (any other line, an envelope, a key written twice, any error).
pub(super) fn parse_marker(line: &str, pos: &SourcePosition) -> Option<Message> {
    let mut scan = Scan::new(line)?;
    scan.expect(b'{')?;
    let (mut status, mut id, mut event_count, mut collections) = (None, None, None, None);
    scan.members(|scan, key| match key {
        "status" => once(&mut status, scan.plain()),
        "id" => once(&mut id, scan.value()),
        "event_count" => once(&mut event_count, scan.value()),
        "data_collections" => once(&mut collections, scan.data_collections()),
        // An envelope (or a change event with a `status`): the full parse.
        "payload" | "schema" => None,
        _ => scan.skip(),
    })?;
    scan.peek().is_none().then_some(())?;
    let id = txn_id_owned(id?)?;
    match status? {
        "BEGIN" => Some(Message::Begin {
            id,
            pos: pos.clone(),
        }),
        "END" => Some(Message::End {
            id,
            event_count: json_u64(event_count.as_ref())?,
            data_collections: collections.unwrap_or_default(),
            pos: pos.clone(),
        }),
        _ => None,
    }
}

/// Reads `line` as a bare change event on a catalog table; `None` where the full parse must
/// decide.
pub(super) fn parse_change(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
    options: &ParseOptions,
) -> Option<Message> {
    let mut payload = read_payload(line)?;
    let op = payload.op?;
    if !matches!(op, "c" | "r" | "u" | "d" | "t") {
        return None;
    }
    let txn = match payload.transaction {
        None => None,
        Some(t) => Some(t?),
    };
    let source = payload.source?;
    let table_name = source.table?;
    let namespace = source.schema.or(source.db);
    // `namespace.table` first, then the bare name; the data collection is the first of them.
    let qualified = namespace.map(|ns| shared_name(&[ns, ".", table_name]));
    let table = qualified
        .as_deref()
        .and_then(catalog)
        .or_else(|| catalog(table_name))?;
    let data_collection = qualified.unwrap_or_else(|| shared_name(&[table_name]));
    let fields = Default::default();
    let rows = Rows {
        table: &table,
        fields: &fields,
        pos,
        options,
    };
    let convert = |columns: &mut Option<Columns<'_>>, image: Image| {
        let columns = columns.as_mut()?;
        let row = rows.convert_from(|name| columns.take(name), image).ok()?;
        // A name written twice: the full parse reads it as a map does.
        columns.took_the_last().then_some(row)
    };
    let change = match op {
        "c" => ChangeOp::Insert(convert(&mut payload.after, Image::After)?),
        "r" => ChangeOp::Upsert(convert(&mut payload.after, Image::After)?),
        "d" => ChangeOp::Delete(convert(&mut payload.before, Image::Before)?),
        "t" => ChangeOp::Truncate,
        _ => {
            let after = convert(&mut payload.after, Image::After)?;
            let before = match payload.before {
                Some(_) => convert(&mut payload.before, Image::Before)?,
                None => key_only(&table, &after),
            };
            ChangeOp::Update { before, after }
        }
    };
    Some(Message::Change(ChangeEvent {
        table,
        data_collection,
        op: change,
        snapshot: op == "r",
        txn,
        connector: source.connector.map(|c| shared_name(&[c])),
        pos: pos.clone(),
    }))
}

/// Puts a field's `value` in its `slot`, once: `None` for a key written twice (which the full
/// parse reads as a map does, the last one counting) and for a value not read.
fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// JSON whitespace (a line with a control character anywhere is left to the full parse, so
/// only the space occurs).
const SPACE: u8 = b' ';
/// Nesting deeper than this is left to the full parse (which has its own limit).
const MAX_DEPTH: usize = 64;

/// A cursor over a line, reading JSON without building anything it does not keep. Every
/// method answers `None` where the line is not what the one-pass read takes: malformed JSON,
/// or a shape it leaves to the full parse.
struct Scan<'a> {
    text: &'a str,
    i: usize,
}

/// A JSON string as read: without escapes (its text, borrowed), or with them (the literal,
/// quotes included, for serde_json to decode: escapes are rare, and it checks them exactly as
/// the full parse does).
enum Str<'a> {
    Plain(&'a str),
    Escaped(&'a str),
}

impl<'a> Scan<'a> {
    /// A cursor at the start of `line`, or `None` where it holds a control character: those
    /// (tabs and line ends included) are rare enough to leave to the full parse, which keeps
    /// the scan's whitespace to spaces and its strings free of them.
    fn new(line: &'a str) -> Option<Self> {
        let control = |chunk: &[u8]| chunk.iter().fold(false, |any, &c| any | (c < 0x20));
        if line.as_bytes().chunks(64).any(control) {
            return None;
        }
        Some(Scan { text: line, i: 0 })
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte after any whitespace.
    fn peek(&mut self) -> Option<u8> {
        let b = self.bytes();
        while b.get(self.i) == Some(&SPACE) {
            self.i += 1;
        }
        b.get(self.i).copied()
    }

    /// Takes `c` if it comes next.
    fn eat(&mut self, c: u8) -> bool {
        let next = self.peek() == Some(c);
        self.i += usize::from(next);
        next
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }

    /// A string (the cursor on its opening quote).
    fn string(&mut self) -> Option<Str<'a>> {
        let b = self.bytes();
        let start = self.i + 1;
        let mut j = start;
        let mut escaped = false;
        loop {
            j = quote_or_backslash(b, j)?;
            if b[j] == b'"' {
                self.i = j + 1;
                return Some(if escaped {
                    Str::Escaped(&self.text[start - 1..j + 1])
                } else {
                    Str::Plain(&self.text[start..j])
                });
            }
            // An escape: its next byte is not the end of the string (serde_json checks it).
            escaped = true;
            j += 2;
        }
    }

    /// A string without escapes.
    fn plain(&mut self) -> Option<&'a str> {
        if self.peek()? != b'"' {
            return None;
        }
        match self.string()? {
            Str::Plain(s) => Some(s),
            Str::Escaped(_) => None,
        }
    }

    /// A key (without escapes) and its colon.
    fn key(&mut self) -> Option<&'a str> {
        let key = self.plain()?;
        self.expect(b':')?;
        Some(key)
    }

    /// Reads the members of an object (the cursor after its `{`) with `member`, which reads
    /// each one's value after its key.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.key()?;
            member(self, key)?;
            if !self.eat(b',') {
                return self.expect(b'}');
            }
        }
    }

    /// Skips a value, checking it is well formed.
    fn skip(&mut self) -> Option<()> {
        // The open containers, the innermost in the lowest bit (set for an object).
        let mut objects: u64 = 0;
        let mut depth = 0usize;
        loop {
            match self.peek()? {
                open @ (b'{' | b'[') => {
                    self.i += 1;
                    if depth == MAX_DEPTH {
                        return None;
                    }
                    let object = open == b'{';
                    if !self.eat(if object { b'}' } else { b']' }) {
                        depth += 1;
                        objects = objects << 1 | u64::from(object);
                        if object {
                            self.key()?;
                        }
                        // Its first value.
                        continue;
                    }
                }
                b'"' => {
                    if let Str::Escaped(literal) = self.string()? {
                        serde_json::from_str::<Json>(literal).ok()?;
                    }
                }
                _ => {
                    self.scalar()?;
                }
            }
            // After a value: the next one in its container, or the end of containers.
            loop {
                if depth == 0 {
                    return Some(());
                }
                let object = objects & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if object {
                            self.key()?;
                        }
                        break;
                    }
                    c if c == if object { b'}' } else { b']' } => {
                        self.i += 1;
                        depth -= 1;
                        objects >>= 1;
                    }
                    _ => return None,
                }
            }
        }
    }

    /// `true`, `false`, `null` or a number, as JSON.
    fn scalar(&mut self) -> Option<Json> {
        let rest = &self.bytes()[self.i..];
        let (word, value): (&[u8], _) = match rest.first()? {
            b'n' => (b"null", Json::Null),
            b't' => (b"true", Json::Bool(true)),
            b'f' => (b"false", Json::Bool(false)),
            _ => return self.number(),
        };
        if !rest.starts_with(word) {
            return None;
        }
        self.i += word.len();
        Some(value)
    }

    /// A number, checked against JSON's grammar: short integers read here, anything else as
    /// serde_json reads it (its float parsing and range errors, exactly as the full parse).
    fn number(&mut self) -> Option<Json> {
        let b = self.bytes();
        let start = self.i;
        let negative = b.get(start) == Some(&b'-');
        let mut j = start + usize::from(negative);
        let int_start = j;
        let mut n: i64 = 0;
        while let Some(d) = b.get(j).filter(|c| c.is_ascii_digit()) {
            n = n.wrapping_mul(10).wrapping_add(i64::from(d - b'0'));
            j += 1;
        }
        let int_digits = j - int_start;
        if int_digits == 0 || int_digits > 1 && b[int_start] == b'0' {
            return None;
        }
        let mut exact = int_digits <= 18 && !(negative && n == 0);
        let mut digits = |j: &mut usize| {
            let from = *j;
            while b.get(*j).is_some_and(u8::is_ascii_digit) {
                *j += 1;
            }
            exact = false;
            *j > from
        };
        if b.get(j) == Some(&b'.') {
            j += 1;
            if !digits(&mut j) {
                return None;
            }
        }
        if matches!(b.get(j), Some(b'e' | b'E')) {
            j += 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if !digits(&mut j) {
                return None;
            }
        }
        self.i = j;
        if exact {
            return Some(Json::from(if negative { -n } else { n }));
        }
        serde_json::from_str(&self.text[start..j]).ok()
    }

    /// `null`.
    fn null(&mut self) -> Option<()> {
        self.scalar()?.is_null().then_some(())
    }

    /// Any value, as JSON.
    fn value(&mut self) -> Option<Json> {
        match self.peek()? {
            b'"' => match self.string()? {
                Str::Plain(s) => Some(Json::String(s.to_owned())),
                Str::Escaped(literal) => serde_json::from_str(literal).ok(),
            },
            b'{' | b'[' => {
                let start = self.i;
                self.skip()?;
                serde_json::from_str(&self.text[start..self.i]).ok()
            }
            _ => self.scalar(),
        }
    }

    /// A column's value: a string without escapes borrowed from the line, anything else as
    /// JSON.
    fn cell(&mut self) -> Option<Cell<'a>> {
        if self.peek()? == b'"' {
            return match self.string()? {
                Str::Plain(s) => Some(Cell::Str(s)),
                Str::Escaped(literal) => serde_json::from_str(literal)
                    .ok()
                    .map(|s| Cell::Json(Cow::Owned(Json::String(s)))),
            };
        }
        self.value().map(|v| Cell::Json(Cow::Owned(v)))
    }

    /// `null` or an object of columns.
    fn image(&mut self) -> Option<Option<Columns<'a>>> {
        match self.peek()? {
            b'n' => self.null().map(|()| None),
            b'{' => {
                self.i += 1;
                let mut columns = Vec::with_capacity(16);
                self.members(|scan, name| {
                    columns.push((name, scan.cell()?, false));
                    Some(())
                })?;
                Some(Some(Columns::new(columns)))
            }
            _ => None,
        }
    }

    /// `source`: the events of a stream often carry the same block, byte for byte, so the
    /// names read from one are found in the next by where they were (see [`SourceMemory`]).
    fn source(&mut self) -> Option<Source<'a>> {
        self.peek()?;
        let start = self.i;
        let rest = &self.bytes()[start..];
        let recalled = SOURCES.with_borrow_mut(|memory| {
            if memory.resting > 0 {
                memory.resting -= 1;
                return Recall::Resting;
            }
            let Some(last) = memory
                .known
                .iter()
                .find(|last| rest.starts_with(&last.block))
            else {
                return Recall::Missed;
            };
            // No store on a hit that follows a hit (measured: the store alone cost about 3% of
            // a line's parse).
            if memory.misses != 0 {
                memory.misses = 0;
            }
            let name = |at: &Option<Range<usize>>| {
                at.as_ref()
                    .map(|r| &self.text[start + r.start..start + r.end])
            };
            let [table, schema, db, connector] = &last.names;
            let source = Source {
                table: name(table),
                schema: name(schema),
                db: name(db),
                connector: name(connector),
            };
            Recall::Found(last.block.len(), source)
        });
        if let Recall::Found(len, source) = recalled {
            self.i += len;
            return Some(source);
        }
        let source = self.read_source()?;
        if let Recall::Missed = recalled {
            self.remember_source(start, &source);
        }
        Some(source)
    }

    /// Keeps the `source` block just read from `start` (a miss), unless misses have come in a
    /// row long enough for the memory to rest.
    #[cold]
    #[inline(never)]
    fn remember_source(&self, start: usize, source: &Source<'a>) {
        let at = |name: Option<&str>| {
            name.map(|n| {
                let from = n.as_ptr() as usize - self.text.as_ptr() as usize - start;
                from..from + n.len()
            })
        };
        SOURCES.with_borrow_mut(|memory| {
            memory.misses += 1;
            if memory.misses >= MISSES_BEFORE_REST {
                memory.misses = 0;
                memory.resting = REST_BLOCKS;
                memory.known.clear();
                return;
            }
            if memory.known.len() == LAST_SOURCES_KEPT {
                memory.known.pop();
            }
            let last = LastSource {
                block: self.bytes()[start..self.i].to_vec(),
                names: [
                    at(source.table),
                    at(source.schema),
                    at(source.db),
                    at(source.connector),
                ],
            };
            memory.known.insert(0, last);
        });
    }

    /// `source` read member by member.
    fn read_source(&mut self) -> Option<Source<'a>> {
        self.expect(b'{')?;
        let mut s = Source::default();
        self.members(|scan, key| {
            let slot = match key {
                "table" => &mut s.table,
                "schema" => &mut s.schema,
                "db" => &mut s.db,
                "connector" => &mut s.connector,
                _ => return scan.skip(),
            };
            // A name that is not a plain string (null, a number, escapes): the full parse
            // decides what it means.
            *slot = Some(scan.plain()?);
            Some(())
        })?;
        Some(s)
    }

    /// END's `data_collections`: `null` (none), or an array of objects each with a
    /// `data_collection` (a string without escapes) and an `event_count`.
    fn data_collections(&mut self) -> Option<Vec<(String, u64)>> {
        if self.peek()? == b'n' {
            return self.null().map(|()| Vec::new());
        }
        self.expect(b'[')?;
        let mut collections = Vec::new();
        if self.eat(b']') {
            return Some(collections);
        }
        loop {
            self.expect(b'{')?;
            let (mut name, mut count) = (None, None);
            self.members(|scan, key| match key {
                "data_collection" => once(&mut name, scan.plain()),
                "event_count" => once(&mut count, scan.value()),
                _ => scan.skip(),
            })?;
            collections.push((name?.to_owned(), json_u64(count.as_ref())?));
            if !self.eat(b',') {
                self.expect(b']')?;
                return Some(collections);
            }
        }
    }

    /// `null` (`None`), or a `transaction` block (`Some(None)` without its three fields).
    fn transaction(&mut self) -> Option<Option<Option<TxnRef>>> {
        if self.peek()? == b'n' {
            return self.null().map(|()| None);
        }
        self.expect(b'{')?;
        let (mut id, mut total_order, mut order) = (None, None, None);
        self.members(|scan, key| {
            let slot = match key {
                "id" => &mut id,
                "total_order" => &mut total_order,
                "data_collection_order" => &mut order,
                _ => return scan.skip(),
            };
            *slot = Some(scan.value()?);
            Some(())
        })?;
        Some(Some(transaction_from(
            id,
            total_order.as_ref(),
            order.as_ref(),
        )))
    }
}

/// The position of the first `"` or `\\` in `b` from `from`, eight bytes at a time (strings
/// are mostly short, where a vectorized search's setup costs more than it saves).
fn quote_or_backslash(b: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // The high bit of each byte of `x` equal to `c` (and perhaps of bytes after the first
    // such byte, which the lowest set bit ignores).
    let equal = |x: u64, c: u8| {
        let y = x ^ (ONES * u64::from(c));
        y.wrapping_sub(ONES) & !y & HIGHS
    };
    let mut j = from;
    while let Some(word) = b.get(j..j + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let found = equal(x, b'"') | equal(x, b'\\');
        if found != 0 {
            return Some(j + found.trailing_zeros() as usize / 8);
        }
        j += 8;
    }
    b[j..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| j + k)
}

/// Reads `line` as a bare change event's payload: what the parse reads of it.
fn read_payload(line: &str) -> Option<Payload<'_>> {
    let mut scan = Scan::new(line)?;
    scan.expect(b'{')?;
    let mut p = Payload::default();
    scan.members(|scan, key| {
        match key {
            "op" => p.op = Some(scan.plain()?),
            "before" => p.before = scan.image()?,
            "after" => p.after = scan.image()?,
            "source" => p.source = Some(scan.source()?),
            "transaction" => p.transaction = scan.transaction()?,
            // An envelope, a transaction marker or a schema change: the full parse.
            "payload" | "schema" | "status" | "ddl" | "tableChanges" => return None,
            _ => scan.skip()?,
        }
        Some(())
    })?;
    // Nothing but whitespace after the object.
    (scan.peek().is_none()).then_some(p)
}
