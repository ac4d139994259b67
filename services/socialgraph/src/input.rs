//! Input files: plain text or gzip (recognised by its magic bytes, so a `.gz` name is not
//! required), read line by line with LF or CR LF endings and an optional final newline.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::{CliError, CliResult};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const BUFFER_BYTES: usize = 1 << 20;

/// Opens `path` for buffered reading, decompressing gzip transparently.
///
/// # Errors
/// [`CliError::Io`] when the file cannot be opened or read.
pub fn open(path: &Path) -> CliResult<Box<dyn BufRead + Send>> {
    let io = |source| CliError::Io { path: path.to_owned(), source };
    let mut file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = read_up_to(&mut file, &mut magic).map_err(io)?;
    let file = File::open(path).map_err(io)?;
    Ok(if n == 2 && magic == GZIP_MAGIC {
        Box::new(BufReader::with_capacity(BUFFER_BYTES, MultiGzDecoder::new(BufReader::new(file))))
    } else {
        Box::new(BufReader::with_capacity(BUFFER_BYTES, file))
    })
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// The [`CliError::Input`] of the line at 0-based `index` of input `name`.
pub fn line_error(name: &str, index: u64, message: String) -> CliError {
    CliError::Input { source_name: name.to_owned(), line: index + 1, message }
}

/// Calls `f(index, line)` for every line of `reader`: `index` is 0-based, `line` is the text
/// with its `\n` / `\r\n` and surrounding whitespace removed. A last line without a newline
/// is still a line; an empty input has none. Stops at the first error of `f`.
///
/// # Errors
/// The first error of `f`; [`CliError::Input`] for a line that is not UTF-8; [`CliError::Io`]
/// (naming `name`) when reading fails.
pub fn for_each_line<R, F>(mut reader: R, name: &str, mut f: F) -> CliResult<u64>
where
    R: BufRead,
    F: FnMut(u64, &str) -> CliResult<()>,
{
    let mut buf = Vec::with_capacity(256);
    let mut index = 0u64;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|source| CliError::Io { path: name.into(), source })?;
        if n == 0 {
            return Ok(index);
        }
        let mut line = buf.as_slice();
        if let Some(rest) = line.strip_suffix(b"\n") {
            line = rest;
        }
        if let Some(rest) = line.strip_suffix(b"\r") {
            line = rest;
        }
        let text = std::str::from_utf8(line).map_err(|_| line_error(name, index, "not UTF-8 text".into()))?;
        f(index, text.trim())?;
        index += 1;
    }
}

/// Parses a decimal number of seconds (`1289241911.72836`, `-3`, `12.`) as whole milliseconds,
/// truncating below the millisecond. Exact: no floating point.
pub fn seconds_to_ms(text: &str) -> Option<i64> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut ms = 0i64;
    for (i, b) in frac.bytes().chain(std::iter::repeat(b'0')).take(3).enumerate() {
        ms += i64::from(b - b'0') * [100, 10, 1][i];
    }
    let total = whole.checked_mul(1000)?.checked_add(ms)?;
    Some(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8]) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for_each_line(text, "t", |i, l| {
            out.push((i, l.to_owned()));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn crlf_lf_and_a_missing_final_newline_give_the_same_lines() {
        let want = vec![(0, "a".to_owned()), (1, "".to_owned()), (2, "b c".to_owned())];
        assert_eq!(lines(b"a\r\n\r\nb c\r\n"), want);
        assert_eq!(lines(b"a\n\nb c"), want);
        assert_eq!(lines(b"a\r\n\r\nb c"), want);
        assert!(lines(b"").is_empty());
    }

    #[test]
    fn fractional_seconds_become_truncated_milliseconds_exactly() {
        assert_eq!(seconds_to_ms("1289241911.72836"), Some(1_289_241_911_728));
        assert_eq!(seconds_to_ms("1407470400"), Some(1_407_470_400_000));
        assert_eq!(seconds_to_ms("1.5"), Some(1500));
        assert_eq!(seconds_to_ms("0.001"), Some(1));
        assert_eq!(seconds_to_ms("-1.5"), Some(-1500));
        assert_eq!(seconds_to_ms("12."), Some(12_000));
        for bad in ["", ".", "1e9", "abc", "1.2.3", "99999999999999999999"] {
            assert_eq!(seconds_to_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn gzip_is_recognised_by_its_magic_bytes() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edges.dat");
        let mut gz = flate2::write::GzEncoder::new(File::create(&path).unwrap(), flate2::Compression::default());
        gz.write_all(b"1\t2\r\n3\t4").unwrap();
        gz.finish().unwrap();
        let mut text = String::new();
        open(&path).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "1\t2\r\n3\t4");
        let plain = dir.path().join("plain.txt");
        std::fs::write(&plain, "x").unwrap();
        let mut text = String::new();
        open(&plain).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "x");
    }
}
