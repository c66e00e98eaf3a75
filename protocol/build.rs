//! The generated Cap'n Proto code is committed, so a build needs no `capnp` tool. With the
//! `regen-capnp` feature the schema is compiled again into `src/generated/`.

fn main() {
    println!("cargo:rerun-if-changed=schema/retina.capnp");
    #[cfg(feature = "regen-capnp")]
    capnpc::CompilerCommand::new()
        .src_prefix("schema")
        .file("schema/retina.capnp")
        .output_path("src/generated")
        .run()
        .expect("compiling schema/retina.capnp: is the `capnp` tool installed (apt-get install capnproto)?");
}
