//! The book's links resolve, the README's and the changelog's links into it too, every book
//! page a file of the workspace cites exists with its anchor, and no comment cites a file outside
//! the repository.

use std::path::{Path, PathBuf};

use socialgraph_book::links::{Broken, Pages, citations, markdown_files, parse};
use socialgraph_book::{book_src, repo_root};

fn report(broken: &[Broken]) -> String {
    broken.iter().map(|b| format!("\n  {b}")).collect()
}

#[test]
fn every_link_and_anchor_of_the_book_resolves() {
    let mut pages = Pages::default();
    let mut broken = Vec::new();
    for file in markdown_files(&book_src()) {
        broken.extend(pages.check_page(&file));
    }
    for file in ["README.md", "CHANGELOG.md"] {
        broken.extend(pages.check_page(&repo_root().join(file)));
    }
    assert!(broken.is_empty(), "broken links:{}", report(&broken));
}

#[test]
fn every_page_is_in_the_summary() {
    let src = book_src();
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap_or_default();
    let listed: Vec<PathBuf> = parse(&summary).1.iter().map(|l| src.join(l)).collect();
    let orphans: Vec<_> = markdown_files(&src).into_iter().filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(f)).collect();
    assert!(orphans.is_empty(), "pages not in docs/src/SUMMARY.md: {orphans:?}");
}

/// The workspace's source files (not the book itself, build output or tools).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    const SKIP: &[&str] = &["target", ".git", ".venv", ".tools", "node_modules", "book"];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIP.contains(&name.as_str()) && !name.starts_with('.') || name == ".ci" || name == ".config" {
                sources(&path, out);
            }
        } else if ["rs", "proto", "toml", "yaml", "yml", "tpl", "py", "sh", "txt"].iter().any(|e| path.extension().is_some_and(|x| x == *e))
            || name == "Makefile"
        {
            out.push(path);
        }
    }
}

fn workspace_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    sources(&repo_root(), &mut files);
    assert!(files.len() > 100, "only {} source files found", files.len());
    files
}

#[test]
fn every_book_page_a_source_file_cites_exists_with_its_anchor() {
    let root = repo_root();
    let mut pages = Pages::default();
    let mut broken = Vec::new();
    let mut cited = 0;
    for file in workspace_sources() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (page, anchor) in citations(&text) {
            cited += 1;
            if let Some(why) = pages.resolve(&root.join(&page), anchor.as_deref()) {
                let link = anchor.map_or(page.clone(), |a| format!("{page}#{a}"));
                broken.push(Broken { file: file.clone(), link, why });
            }
        }
    }
    assert!(cited >= 12, "only {cited} citations of the book found");
    assert!(broken.is_empty(), "citations of the book that do not resolve:{}", report(&broken));
}

#[test]
fn no_comment_cites_a_file_outside_the_repository() {
    let mut found = Vec::new();
    for file in workspace_sources() {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let rust_like = file.extension().is_some_and(|e| e == "rs" || e == "proto");
        for (n, line) in text.lines().enumerate() {
            let comment = if rust_like { line.find("//").map(|at| &line[at..]) } else { line.trim_start().strip_prefix('#') };
            if comment.is_some_and(|c| c.contains("DESIGN.md") || c.contains("DESIGN §") || c.contains("../shared")) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "comments citing files outside the repository (cite the book, docs/src/…):\n{}", found.join("\n"));
}
