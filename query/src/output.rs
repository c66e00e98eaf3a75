//! Query results as text: an aligned table, CSV with a header, or JSON (one object per row).

use std::io::Write;

use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;

/// How `retina sql` prints a result.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Csv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown format `{other}`: table, csv or json")),
        }
    }
}

/// Writes `batches` to `out` in `format`.
pub fn write_batches(
    out: &mut dyn Write,
    format: Format,
    batches: &[RecordBatch],
) -> Result<(), ArrowError> {
    match format {
        Format::Table => {
            let table = datafusion::arrow::util::pretty::pretty_format_batches(batches)?;
            writeln!(out, "{table}")?;
        }
        Format::Csv => {
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(out);
            w.write_batches(&batches.iter().collect::<Vec<_>>())?;
            w.finish()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a,b"), None])),
            ],
        )
        .unwrap()
    }

    fn text(format: Format) -> String {
        let mut out = Vec::new();
        write_batches(&mut out, format, &[batch()]).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_format_prints_every_row() {
        assert_eq!(text(Format::Csv), "id,name\n1,\"a,b\"\n2,\n");
        assert_eq!(
            text(Format::Json),
            "{\"id\":1,\"name\":\"a,b\"}\n{\"id\":2}\n"
        );
        let table = text(Format::Table);
        assert!(table.contains("| id | name |"), "{table}");
        assert!(table.contains("| 1  | a,b  |"), "{table}");
        assert_eq!("csv".parse(), Ok(Format::Csv));
        assert!("xml".parse::<Format>().is_err());
    }
}
