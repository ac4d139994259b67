//! Internal links of the book, resolved as mdBook resolves them: a link names a file relative to
//! the page (`../api/overview.md`), optionally with a `#fragment` that must be the id of a
//! heading of that page. Heading ids follow mdBook 0.5: an explicit `{#id}`, else the heading's
//! text trimmed and lower-cased, whitespace turned into `-`, every character that is not
//! alphanumeric, `_` or `-` dropped, and `-1`, `-2`, … appended to repeats within a page.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// One link that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The file the link is in (or the code file that cites the page).
    pub file: PathBuf,
    /// The link as written.
    pub link: String,
    /// What is wrong.
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.file.display(), self.link, self.why)
    }
}

/// The parser options mdBook 0.5 renders with.
fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES
        | Options::ENABLE_SMART_PUNCTUATION
}

/// mdBook's id of a heading whose text is `text`.
pub fn heading_id(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The heading ids of a page and the destinations of its links and images, in order.
pub fn parse(markdown: &str) -> (Vec<String>, Vec<String>) {
    let mut ids = Vec::new();
    let mut used = HashSet::new();
    let mut links = Vec::new();
    let mut heading: Option<(Option<String>, String)> = None;
    for event in Parser::new_ext(markdown, options()) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => heading = Some((id.map(|i| i.to_string()), String::new())),
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, text)) = heading.as_mut() {
                    text.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((explicit, text)) = heading.take() {
                    let id = explicit.unwrap_or_else(|| heading_id(&text));
                    ids.push(unique(id, &mut used));
                }
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            _ => {}
        }
    }
    (ids, links)
}

fn unique(id: String, used: &mut HashSet<String>) -> String {
    let mut candidate = id.clone();
    let mut n = 0;
    while !used.insert(candidate.clone()) {
        n += 1;
        candidate = format!("{id}-{n}");
    }
    candidate
}

/// Whether a link leaves the repository (a URL with a scheme, or mail).
fn external(link: &str) -> bool {
    link.split_once(':').is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c)))
}

/// `path` with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The heading ids of Markdown files, read once each.
#[derive(Default)]
pub struct Pages {
    ids: BTreeMap<PathBuf, Option<Vec<String>>>,
}

impl Pages {
    fn ids(&mut self, file: &Path) -> Option<&Vec<String>> {
        self.ids.entry(file.to_path_buf()).or_insert_with(|| std::fs::read_to_string(file).ok().map(|text| parse(&text).0)).as_ref()
    }

    /// Why `target` (a file, and a fragment or none) does not resolve, or `None` when it does.
    pub fn resolve(&mut self, file: &Path, fragment: Option<&str>) -> Option<String> {
        if !file.exists() {
            return Some(format!("no file {}", file.display()));
        }
        let fragment = fragment.filter(|f| !f.is_empty())?;
        if file.extension().is_none_or(|e| e != "md") {
            return Some("a fragment into a file that is not a page".into());
        }
        match self.ids(file) {
            Some(ids) if ids.iter().any(|id| id == fragment) => None,
            Some(_) => Some(format!("no heading with id `{fragment}` in {}", file.display())),
            None => Some(format!("{} cannot be read", file.display())),
        }
    }

    /// The links of the Markdown page `file` that do not resolve.
    pub fn check_page(&mut self, file: &Path) -> Vec<Broken> {
        let Ok(text) = std::fs::read_to_string(file) else {
            return vec![Broken { file: file.to_path_buf(), link: String::new(), why: "cannot be read".into() }];
        };
        let dir = file.parent().unwrap_or(Path::new("."));
        let mut broken = Vec::new();
        for link in parse(&text).1 {
            if external(&link) {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() { file.to_path_buf() } else { normalize(&dir.join(path)) };
            // mdBook renders a chapter README.md as index.html but rewrites links to it as
            // README.html: such a link works on a forge and is a 404 in the book.
            let in_book = file.starts_with(crate::book_src()) && target.starts_with(crate::book_src());
            if in_book && target.file_name().is_some_and(|n| n == "README.md") {
                broken.push(Broken {
                    file: file.to_path_buf(),
                    link: link.clone(),
                    why: "mdBook serves README.md as index.html: name the page index.md".into(),
                });
                continue;
            }
            if let Some(why) = self.resolve(&target, fragment) {
                broken.push(Broken { file: file.to_path_buf(), link: link.clone(), why });
            }
        }
        broken
    }
}

/// Every Markdown file under `dir`, sorted.
pub fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The book pages `text` cites as `docs/src/<page>.md` or `docs/src/<page>.md#<anchor>`.
pub fn citations(text: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("docs/src/") {
        let cited: String = text[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || "_./#-".contains(*c)).collect();
        let cited = cited.trim_end_matches(['.', '-', '#']);
        let (page, anchor) = match cited.split_once('#') {
            Some((page, anchor)) => (page, Some(anchor.to_owned())),
            None => (cited, None),
        };
        if page.ends_with(".md") {
            out.push((page.to_owned(), anchor));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heading_ids_follow_mdbook() {
        let page = "# Counters\n## counter-svc's Redis\n## The like/fav relay\n## `sg:uc:{u:B}` layout\n## Effectively once\n## Effectively once\n## Custom {#my-id}\n";
        let (ids, _) = parse(page);
        assert_eq!(ids, ["counters", "counter-svcs-redis", "the-likefav-relay", "sgucub-layout", "effectively-once", "effectively-once-1", "my-id"]);
    }

    #[test]
    fn links_and_citations_are_found() {
        let (_, links) = parse("See [a](../a.md#x), [b](#y), <https://example.com> and ![i](img.png).");
        assert_eq!(links, ["../a.md#x", "#y", "https://example.com", "img.png"]);
        assert!(external("https://example.com") && external("mailto:a@b.c") && !external("../a.md#x"));
        let cited = citations("// see docs/src/architecture/events.md#effectively-once. And docs/src/api/overview.md.");
        assert_eq!(cited, [("docs/src/architecture/events.md".into(), Some("effectively-once".into())), ("docs/src/api/overview.md".into(), None)]);
    }
}
