//! The book in `docs/` and what keeps it true:
//! - [`reference`]: the Markdown API reference of every proto package, generated from the
//!   descriptors and their comments (`make reference` writes it into `docs/src/api/reference`);
//! - [`links`]: every link and `#anchor` between the book's pages, the README's and the
//!   changelog's links into it, and the book pages code comments cite, resolved with mdBook's
//!   rules for heading ids;
//! - [`settings`]: the setting keys of a configuration and of the configuration reference's
//!   tables, to compare them.

pub mod links;
pub mod reference;
pub mod settings;

use std::path::PathBuf;

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// `docs/src`, the book's sources.
pub fn book_src() -> PathBuf {
    repo_root().join("docs/src")
}

/// Where the generated reference pages live, inside the book.
pub const REFERENCE_DIR: &str = "api/reference";
