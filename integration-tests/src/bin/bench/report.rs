//! Measuring and printing, shared by every part: latency histograms and their percentiles, the
//! result of a closed-loop run, and the result tables (service beside raw baseline, with the
//! ratio svc/raw).

use std::time::Duration;

use hdrhistogram::Histogram;

pub(crate) type Hist = Histogram<u64>;

/// Latencies in microseconds, up to 10 minutes.
pub(crate) fn hist() -> Hist {
    Histogram::new_with_bounds(1, 600_000_000, 3).unwrap_or_else(|_| unreachable!("valid histogram bounds"))
}

/// The latency at quantile `q` of `h`, in milliseconds.
pub(crate) fn ms(h: &Hist, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// One closed-loop run.
pub(crate) struct Run {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) lat: Hist,
}

impl Run {
    pub(crate) fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(crate) fn p50(&self) -> f64 {
        ms(&self.lat, 0.50)
    }

    pub(crate) fn p99(&self) -> f64 {
        ms(&self.lat, 0.99)
    }

    /// `n ok in t s` plus errors, for the notes under a table.
    pub(crate) fn describe(&self, what: &str) -> String {
        let mut s = format!("{what}: {} ok in {:.1} s", self.ok, self.elapsed.as_secs_f64());
        if self.errors > 0 {
            s += &format!(", {} errors (first: {})", self.errors, self.first_error.as_deref().unwrap_or("?"));
        }
        s
    }
}

/// One line of a result table: the service's value, the raw baseline's, their ratio.
pub(crate) struct Row {
    what: String,
    svc: String,
    raw: String,
    ratio: String,
}

fn fmt_num(v: f64, unit: &str) -> String {
    let n = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if unit.is_empty() { n } else { format!("{n} {unit}") }
}

/// A table row of `svc` beside `raw` (both in `unit`) and their ratio, `-` when there is none.
pub(crate) fn row(what: impl Into<String>, svc: f64, raw: f64, unit: &str) -> Row {
    let ratio = if raw > 0.0 && svc.is_finite() { format!("{:.2}", svc / raw) } else { "-".into() };
    Row { what: what.into(), svc: fmt_num(svc, unit), raw: fmt_num(raw, unit), ratio }
}

/// Two rows per latency pair: p50 and p99 of each (name, service, raw) in milliseconds.
pub(crate) fn latency_rows(pairs: &[(&str, &Hist, &Hist)]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (what, svc, raw) in pairs {
        rows.push(row(format!("{what} p50"), ms(svc, 0.5), ms(raw, 0.5), "ms"));
        rows.push(row(format!("{what} p99"), ms(svc, 0.99), ms(raw, 0.99), "ms"));
    }
    rows
}

/// Prints `rows` under `title` in aligned columns, then each of `notes` as a `*` line.
pub(crate) fn print_table(title: &str, svc_label: &str, raw_label: &str, rows: &[Row], notes: &[String]) {
    let w0 = rows.iter().map(|r| r.what.len()).max().unwrap_or(0).max(6);
    let w1 = rows.iter().map(|r| r.svc.len()).max().unwrap_or(0).max(svc_label.len());
    let w2 = rows.iter().map(|r| r.raw.len()).max().unwrap_or(0).max(raw_label.len());
    println!("\n{title}");
    println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7}", "metric", svc_label, raw_label, "svc/raw");
    println!("  {:-<w0$}-+-{:->w1$}-+-{:->w2$}-+-{:->7}", "", "", "", "");
    for r in rows {
        println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7}", r.what, r.svc, r.raw, r.ratio);
    }
    for n in notes {
        println!("  * {n}");
    }
}

/// The banner that opens a part, with the machine's load average.
pub(crate) fn header(part: &str) {
    println!("\n==================== {part} (load average {}) ====================", load_average());
}

/// A progress line: what the part measures next.
pub(crate) fn progress(msg: &str) {
    println!("  .. {msg}");
}

/// One line of the closing summary: the speed targets, each path beside its raw baseline.
struct SummaryLine {
    path: String,
    now: String,
    raw: String,
    ratio: String,
    target: String,
}

static SUMMARY: std::sync::Mutex<Vec<SummaryLine>> = std::sync::Mutex::new(Vec::new());

/// Records one line of the closing summary: `svc` beside `raw` (0: no baseline) in `unit`, and
/// the target it is held to.
pub(crate) fn summarize(path: impl Into<String>, svc: f64, raw: f64, unit: &str, target: &str) {
    let r = row(path, svc, raw, unit);
    let raw = if raw == 0.0 { "-".into() } else { r.raw };
    let line = SummaryLine { path: r.what, now: r.svc, raw, ratio: r.ratio, target: target.into() };
    SUMMARY.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
}

/// The machine's load average (1, 5, 15 min) as printed by /proc/loadavg.
pub(crate) fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Prints every line recorded by [`summarize`] as one table, with the load average at the
/// start of the run and now.
pub(crate) fn print_summary(load_at_start: &str) {
    let lines = SUMMARY.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if lines.is_empty() {
        return;
    }
    let w = |f: &dyn Fn(&SummaryLine) -> usize, min: usize| lines.iter().map(f).max().unwrap_or(0).max(min);
    let (w0, w1, w2, w3) = (w(&|l| l.path.len(), 4), w(&|l| l.now.len(), 3), w(&|l| l.raw.len(), 12), w(&|l| l.target.len(), 6));
    println!("\n==================== summary (load average at start {load_at_start}, now {}) ====================", load_average());
    println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7} | {:<w3$}", "path", "now", "raw baseline", "ratio", "target");
    println!("  {:-<w0$}-+-{:->w1$}-+-{:->w2$}-+-{:->7}-+-{:-<w3$}", "", "", "", "", "");
    for l in lines.iter() {
        println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7} | {:<w3$}", l.path, l.now, l.raw, l.ratio, l.target);
    }
}
