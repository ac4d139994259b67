//! `socialgraph-book reference [DIR]`: writes the API reference generated from the proto into
//! DIR (default `docs/src/api/reference`), one Markdown page per package.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("reference") => {
            let dir = args.next().map(PathBuf::from).unwrap_or_else(|| socialgraph_book::book_src().join(socialgraph_book::REFERENCE_DIR));
            let pages = socialgraph_book::reference::pages()?;
            std::fs::create_dir_all(&dir)?;
            for (name, text) in &pages {
                std::fs::write(dir.join(format!("{name}.md")), text)?;
            }
            eprintln!("wrote {} pages into {}", pages.len(), dir.display());
            Ok(())
        }
        _ => anyhow::bail!("usage: socialgraph-book reference [DIR]"),
    }
}
