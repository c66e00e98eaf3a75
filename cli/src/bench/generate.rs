//! `retina bench generate`: a generated workload (CH-benCHmark or HyBench) written to a folder as
//! DDL and Debezium JSON lines, with the change stream's self-check.

use std::io::BufWriter;

use anyhow::Context;

pub(super) fn run(
    workload: &str,
    scale: &str,
    txns: usize,
    seed: u64,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use retina_bench::{chgen, hybench, workload::SelfCheck};
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let number = || -> anyhow::Result<i64> {
        scale
            .parse()
            .map_err(|_| anyhow::anyhow!("--scale `{scale}`: `tiny` or a positive number"))
    };
    let json = out.join("changes.json");
    let mut file = BufWriter::new(
        std::fs::File::create(&json).with_context(|| format!("creating {}", json.display()))?,
    );
    let (ddl, check) = match workload {
        "ch" => {
            let s = match scale {
                "tiny" => chgen::ChScale::tiny(),
                _ => chgen::ChScale::tpcc(number()?),
            };
            let w = chgen::generate(s, seed, txns);
            w.write_debezium(&mut file)?;
            (chgen::DDL, SelfCheck::of(&chgen::schemas(), &w.stream))
        }
        "hybench" => {
            let s = match scale {
                "tiny" => hybench::HyScale::tiny(),
                _ => hybench::HyScale::sf(number()?),
            };
            let w = hybench::generate(s, seed, txns);
            w.write_debezium(&mut file)?;
            (hybench::DDL, SelfCheck::of(&hybench::schemas(), &w.stream))
        }
        other => anyhow::bail!("unknown workload `{other}`: ch or hybench"),
    };
    std::io::Write::flush(&mut file)?;
    std::fs::write(out.join("schema.sql"), ddl)?;
    println!(
        "{workload} at scale {scale}, seed {seed}: {} and {} ({:.0} MiB)",
        out.join("schema.sql").display(),
        json.display(),
        std::fs::metadata(&json)?.len() as f64 / (1 << 20) as f64
    );
    println!("the change stream's self-check:\n{check}");
    Ok(())
}
