//! Which tables a path descriptor names.
//!
//! Each element of the path is a table: `["accounts", "transfers"]` reads two tables at one
//! snapshot. A table in a schema is one element, `"bank.accounts"`, or two, `["bank",
//! "accounts"]`: an element that is not a table's name itself, followed by another element,
//! names the table `ELEMENT.NEXT` when there is one. So an element that is a table's name is
//! always that table; where both readings exist (tables `bank` and `bank.accounts`), write
//! the qualified table as one element.

use tonic::Status;

/// The tables `path` names, in its order, each once; `tables` are the node's table names.
pub(crate) fn resolve(path: &[String], tables: &[String]) -> Result<Vec<String>, Status> {
    if path.is_empty() {
        return Err(Status::invalid_argument(
            "an empty path descriptor names no table",
        ));
    }
    let is_table = |name: &str| tables.iter().any(|t| t == name);
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < path.len() {
        let element = &path[i];
        let name = if is_table(element) {
            i += 1;
            element.clone()
        } else if let Some(qualified) = path
            .get(i + 1)
            .map(|next| format!("{element}.{next}"))
            .filter(|q| is_table(q))
        {
            i += 2;
            qualified
        } else {
            return Err(Status::not_found(format!(
                "path element {i} (`{element}`) names no table; the tables are {}",
                list(tables)
            )));
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

fn list(tables: &[String]) -> String {
    if tables.is_empty() {
        return "none".into();
    }
    tables
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A table's name as SQL's catalog has it: its schema (`public` when the name has none) and
/// its own name.
pub(crate) fn split(name: &str) -> (&str, &str) {
    name.split_once('.').unwrap_or(("public", name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn elements_are_tables_and_a_schema_joins_the_element_after_it() {
        let tables = path(&["bank.accounts", "bank.transfers", "orders", "bank"]);
        assert_eq!(resolve(&path(&["orders"]), &tables).unwrap(), ["orders"]);
        assert_eq!(
            resolve(&path(&["bank.accounts", "orders"]), &tables).unwrap(),
            ["bank.accounts", "orders"]
        );
        // `bank` is a table itself: it is read as that table, then `accounts` is no table.
        let err = resolve(&path(&["bank", "accounts"]), &tables).unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert!(
            err.message().contains("path element 1 (`accounts`)"),
            "{err}"
        );
        let tables = path(&["bank.accounts", "bank.transfers", "orders"]);
        assert_eq!(
            resolve(&path(&["bank", "accounts", "bank", "transfers"]), &tables).unwrap(),
            ["bank.accounts", "bank.transfers"]
        );
        assert_eq!(
            resolve(&path(&["orders", "orders"]), &tables).unwrap(),
            ["orders"],
            "a table named twice is read once"
        );
        let err = resolve(&path(&["nope"]), &tables).unwrap_err();
        assert!(
            err.message()
                .contains("`bank.accounts`, `bank.transfers`, `orders`"),
            "{err}"
        );
        assert_eq!(
            resolve(&[], &tables).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_name_without_schema_is_in_public() {
        assert_eq!(split("bank.accounts"), ("bank", "accounts"));
        assert_eq!(split("orders"), ("public", "orders"));
    }
}
