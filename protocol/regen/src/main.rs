//! `cargo run -p retina-capnp-regen` compiles the Cap'n Proto contract,
//! `protocol/schema/retina.capnp`, into `protocol/src/generated/`.
//!
//! The generated code is committed, so building Retina needs no `capnp` tool; CI runs this and
//! fails when `git diff` shows the committed code is stale. It lives in a crate of its own so
//! that regenerating compiles `capnpc` alone, not the protocol crate and everything below it.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let protocol = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("protocol/regen has a parent folder");
    let schema = protocol.join("schema");
    let generated = protocol.join("src/generated");
    let result = capnpc::CompilerCommand::new()
        .src_prefix(&schema)
        .file(schema.join("retina.capnp"))
        .output_path(&generated)
        .run();
    match result {
        Ok(()) => {
            println!("{} regenerated", generated.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "compiling {}: {e} (is the `capnp` tool installed? apt-get install capnproto)",
                schema.join("retina.capnp").display()
            );
            ExitCode::FAILURE
        }
    }
}
