//! `retina bench report`: the newest results as SVG charts and a Markdown report.

/// Writes the charts beside the newest results in bench/results/ and the report to `out`.
pub(super) fn run(out: &std::path::Path) -> anyhow::Result<()> {
    let written = retina_bench::report::write(&retina_bench::results::results_dir(), out)
        .map_err(anyhow::Error::msg)?;
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}
