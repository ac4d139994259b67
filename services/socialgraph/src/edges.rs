//! Follow edge lists read from files, with the rules `load follows` and `verify` share.
//!
//! Formats:
//! - **SNAP text**: `FOLLOWER FOLLOWEE` per line, tab or space separated; lines starting with
//!   `#` and blank lines are skipped; further columns are ignored.
//! - **CSV**: `SOURCE,TARGET[,RATING[,TIME]]` as in SNAP's Bitcoin trust graphs. A row whose
//!   RATING is ≤ 0 is not a follow (distrust) and is skipped. TIME is Unix seconds, possibly
//!   fractional, and becomes `followed_at` in whole milliseconds (truncated). A first row whose
//!   first field is not a number is a header and is skipped.
//!
//! Edges without a time get `followed_at = LINE_ORDER_BASE_MS + line index` (0-based index of
//! the line in the decompressed file, comment lines included), so a later line is a newer
//! follow and list order is reproducible.
//!
//! Ids: `--id-offset N` adds N to every id; an id that is then ≤ 0 is refused (ids are > 0).
//! Self-loops are skipped and counted; of repeated (follower, followee) pairs the first
//! occurrence wins and the others are counted as duplicates.

use std::collections::HashSet;
use std::path::Path;

use serde::Serialize;

use crate::error::CliResult;
use crate::input::{for_each_line, line_error, open, seconds_to_ms};

/// Base of line-order follow times: 2020-01-01T00:00:00Z in ms since the Unix epoch.
pub const LINE_ORDER_BASE_MS: i64 = 1_577_836_800_000;

/// Layout of an edge file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum EdgeFormat {
    /// CSV when the name ends in `.csv` or `.csv.gz`, else SNAP text.
    #[default]
    Auto,
    /// Whitespace-separated `FOLLOWER FOLLOWEE`, `#` comments.
    Snap,
    /// `SOURCE,TARGET[,RATING[,TIME]]`.
    Csv,
}

impl EdgeFormat {
    /// Resolves [`EdgeFormat::Auto`] from the file name.
    pub fn resolve(self, path: &Path) -> Self {
        match self {
            Self::Auto => {
                let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
                if name.ends_with(".csv") || name.ends_with(".csv.gz") { Self::Csv } else { Self::Snap }
            }
            other => other,
        }
    }
}

/// How to read an edge file.
#[derive(Debug, Clone, Copy, Default)]
pub struct EdgeFileOptions {
    /// The layout.
    pub format: EdgeFormat,
    /// Added to every id before it is checked (e.g. 1 for files numbering users from 0).
    pub id_offset: i64,
}

/// One follow read from a file: `follower_id` follows `followee_id` since `followed_at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FileEdge {
    /// The user who follows (> 0).
    pub follower_id: i64,
    /// The user followed (> 0, ≠ follower_id).
    pub followee_id: i64,
    /// Follow time, ms since the Unix epoch.
    pub followed_at_ms: i64,
}

/// What reading a file saw, line by line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ParseStats {
    /// Every line of the (decompressed) file.
    pub lines_read: u64,
    /// Comment, blank and header lines.
    pub skipped_lines: u64,
    /// Lines that named an edge.
    pub edge_lines: u64,
    /// Edges from a user to itself, skipped.
    pub self_loops: u64,
    /// Repeats of an earlier (follower, followee) pair, skipped.
    pub duplicates: u64,
    /// CSV rows with a rating ≤ 0 (not a follow), skipped.
    pub not_follows: u64,
    /// Edges kept: `edge_lines - self_loops - duplicates - not_follows`.
    pub edges: u64,
}

/// The follow graph a file describes, after id mapping, self-loop and duplicate rules.
#[derive(Debug, Clone, Default)]
pub struct FollowGraph {
    /// Kept edges in file order.
    pub edges: Vec<FileEdge>,
    /// Every user id named on an edge line (self-loops and skipped rows included), ascending.
    pub users: Vec<i64>,
    /// Counts of what was read.
    pub stats: ParseStats,
}

/// Reads the follow graph of the file at `path`.
///
/// # Errors
/// [`CliError::Io`] when the file cannot be read; [`CliError::Input`] naming the first bad line.
pub fn read_follow_file(path: &Path, opts: EdgeFileOptions) -> CliResult<FollowGraph> {
    let format = opts.format.resolve(path);
    parse_follows(open(path)?, &path.display().to_string(), EdgeFileOptions { format, ..opts })
}

/// Parses an edge list from `reader`; `name` names it in errors. `Auto` means SNAP text here.
///
/// # Errors
/// [`CliError::Input`] naming the first bad line; [`CliError::Io`] when reading fails.
pub fn parse_follows(reader: impl std::io::BufRead, name: &str, opts: EdgeFileOptions) -> CliResult<FollowGraph> {
    let csv = opts.format == EdgeFormat::Csv;
    let mut graph = FollowGraph::default();
    let mut seen: HashSet<(i64, i64)> = HashSet::new();
    let mut users: HashSet<i64> = HashSet::new();
    let mut first_data_line = true;
    let lines = for_each_line(reader, name, |index, line| {
        let bad = |message: String| line_error(name, index, message);
        if line.is_empty() || line.starts_with('#') {
            graph.stats.skipped_lines += 1;
            return Ok(());
        }
        let fields: Vec<&str> = if csv { line.split(',').map(str::trim).collect() } else { line.split_ascii_whitespace().collect() };
        let is_header = first_data_line && fields[0].parse::<i64>().is_err();
        first_data_line = false;
        if is_header && csv {
            graph.stats.skipped_lines += 1;
            return Ok(());
        }
        let row = parse_row(&fields, csv, opts.id_offset, index).map_err(bad)?;
        graph.stats.edge_lines += 1;
        users.insert(row.edge.follower_id);
        users.insert(row.edge.followee_id);
        if !row.follow {
            graph.stats.not_follows += 1;
        } else if row.edge.follower_id == row.edge.followee_id {
            graph.stats.self_loops += 1;
        } else if !seen.insert((row.edge.follower_id, row.edge.followee_id)) {
            graph.stats.duplicates += 1;
        } else {
            graph.edges.push(row.edge);
        }
        Ok(())
    })?;
    graph.stats.lines_read = lines;
    graph.stats.edges = graph.edges.len() as u64;
    graph.users = users.into_iter().collect();
    graph.users.sort_unstable();
    Ok(graph)
}

struct Row {
    edge: FileEdge,
    follow: bool,
}

fn parse_row(fields: &[&str], csv: bool, id_offset: i64, index: u64) -> Result<Row, String> {
    if fields.len() < 2 {
        let layout = if csv { "SOURCE,TARGET[,RATING[,TIME]]" } else { "two ids separated by a tab or spaces" };
        return Err(format!("expected {layout}, got {:?}", fields.join(if csv { "," } else { " " })));
    }
    let follower_id = user_id(fields[0], id_offset)?;
    let followee_id = user_id(fields[1], id_offset)?;
    let mut follow = true;
    let mut followed_at_ms = LINE_ORDER_BASE_MS + index as i64;
    if csv {
        if let Some(rating) = fields.get(2).filter(|r| !r.is_empty()) {
            let rating: f64 = rating.parse().map_err(|_| format!("RATING {rating:?} is not a number"))?;
            follow = rating > 0.0;
        }
        if let Some(time) = fields.get(3).filter(|t| !t.is_empty()) {
            followed_at_ms = seconds_to_ms(time).ok_or_else(|| format!("TIME {time:?} is not a number of Unix seconds"))?;
        }
    }
    Ok(Row { edge: FileEdge { follower_id, followee_id, followed_at_ms }, follow })
}

fn user_id(field: &str, id_offset: i64) -> Result<i64, String> {
    let raw: i64 = field.parse().map_err(|_| format!("{field:?} is not an integer user id"))?;
    let id = raw.checked_add(id_offset).ok_or_else(|| format!("user id {raw} + --id-offset {id_offset} overflows"))?;
    if id > 0 {
        return Ok(id);
    }
    let shown = if id_offset == 0 { format!("user id {raw}") } else { format!("user id {raw} (+ offset {id_offset} = {id})") };
    let hint = if id == 0 { format!("; this file numbers users from {}: pass --id-offset {}", -id_offset, id_offset + 1) } else { String::new() };
    Err(format!("{shown} is not allowed: ids must be > 0{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(text: &str, id_offset: i64) -> CliResult<FollowGraph> {
        parse_follows(text.as_bytes(), "t.txt", EdgeFileOptions { format: EdgeFormat::Snap, id_offset })
    }

    fn csv(text: &str) -> FollowGraph {
        parse_follows(text.as_bytes(), "t.csv", EdgeFileOptions { format: EdgeFormat::Csv, id_offset: 0 }).unwrap()
    }

    fn pairs(g: &FollowGraph) -> Vec<(i64, i64, i64)> {
        g.edges.iter().map(|e| (e.follower_id, e.followee_id, e.followed_at_ms - LINE_ORDER_BASE_MS)).collect()
    }

    #[test]
    fn snap_text_with_crlf_comments_spaces_and_no_final_newline() {
        let g = snap("# Directed graph\r\n# FromNodeId\tToNodeId\r\n1\t2\r\n\r\n3   4\r\n 5 6 extra\r\n7\t8", 0).unwrap();
        assert_eq!(pairs(&g), [(1, 2, 2), (3, 4, 4), (5, 6, 5), (7, 8, 6)]);
        assert_eq!(g.stats.lines_read, 7);
        assert_eq!(g.stats.skipped_lines, 3);
        assert_eq!(g.stats.edge_lines, 4);
        assert_eq!(g.users, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn self_loops_and_duplicates_are_counted_and_the_first_occurrence_wins() {
        let g = snap("1 2\n2 2\n1 2\n2 1\n3 3\n1 2", 0).unwrap();
        assert_eq!(pairs(&g), [(1, 2, 0), (2, 1, 3)]);
        let s = g.stats;
        assert_eq!((s.edge_lines, s.self_loops, s.duplicates, s.edges), (6, 2, 2, 2));
        assert_eq!(g.users, [1, 2, 3], "a user seen only on a self-loop is still a user");
    }

    #[test]
    fn id_zero_is_refused_with_a_hint_and_the_offset_maps_it() {
        let err = snap("# c\n0\t1\n", 0).unwrap_err().to_string();
        assert!(err.starts_with("t.txt:2: user id 0 is not allowed"), "{err}");
        assert!(err.contains("--id-offset 1"), "{err}");
        let g = snap("0\t1\n1\t0\n", 1).unwrap();
        assert_eq!(pairs(&g), [(1, 2, 0), (2, 1, 1)]);
        let err = snap("-1 2", 1).unwrap_err().to_string();
        assert!(err.contains("--id-offset 2"), "{err}");
        let err = snap("-5 2", 0).unwrap_err().to_string();
        assert!(err.contains("ids must be > 0") && !err.contains("--id-offset"), "{err}");
    }

    #[test]
    fn malformed_lines_name_their_line() {
        assert_eq!(snap("1 2\n3\n", 0).unwrap_err().to_string(), "t.txt:2: expected two ids separated by a tab or spaces, got \"3\"");
        assert!(snap("1 x", 0).unwrap_err().to_string().contains("\"x\" is not an integer user id"));
        let header = snap("from to\n1 2", 0).unwrap_err().to_string();
        assert!(header.starts_with("t.txt:1:"), "SNAP text has no header rows: {header}");
    }

    #[test]
    fn csv_negative_ratings_are_not_follows_and_fractional_times_become_ms() {
        let g = csv("6,2,4,1289241911.72836\n6,5,2,1289241941.53378\n1,15,-10,1289243140.39049\n4,3,7,1289245277\n");
        let got: Vec<_> = g.edges.iter().map(|e| (e.follower_id, e.followee_id, e.followed_at_ms)).collect();
        assert_eq!(got, [(6, 2, 1_289_241_911_728), (6, 5, 1_289_241_941_533), (4, 3, 1_289_245_277_000)]);
        assert_eq!((g.stats.not_follows, g.stats.edges), (1, 3));
        assert_eq!(g.users, [1, 2, 3, 4, 5, 6, 15]);
    }

    #[test]
    fn csv_header_and_missing_time_fall_back_to_line_order() {
        let g = csv("SOURCE,TARGET,RATING,TIME\r\n1,2\r\n3,4,1\r\n");
        assert_eq!(pairs(&g), [(1, 2, 1), (3, 4, 2)]);
        assert_eq!(g.stats.skipped_lines, 1);
        let err = parse_follows("1,2,x".as_bytes(), "t.csv", EdgeFileOptions { format: EdgeFormat::Csv, id_offset: 0 });
        assert!(err.unwrap_err().to_string().contains("RATING \"x\""));
    }

    #[test]
    fn format_is_chosen_from_the_name() {
        let auto = EdgeFormat::Auto;
        assert_eq!(auto.resolve(Path::new("a/soc-sign-bitcoinotc.csv.gz")), EdgeFormat::Csv);
        assert_eq!(auto.resolve(Path::new("x.CSV")), EdgeFormat::Csv);
        assert_eq!(auto.resolve(Path::new("soc-Slashdot0902.txt.gz")), EdgeFormat::Snap);
        assert_eq!(EdgeFormat::Snap.resolve(Path::new("x.csv")), EdgeFormat::Snap);
    }

    #[test]
    fn gzip_files_are_read_directly() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.txt.gz");
        let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::default());
        gz.write_all(b"# c\r\n0\t1\r\n1\t0\r\n1\t1").unwrap();
        gz.finish().unwrap();
        let g = read_follow_file(&path, EdgeFileOptions { format: EdgeFormat::Auto, id_offset: 1 }).unwrap();
        assert_eq!(pairs(&g), [(1, 2, 1), (2, 1, 2)]);
        assert_eq!(g.stats.self_loops, 1);
    }
}
