//! The command line's tables and durations, shared by every command that prints a list.
//!
//! Tables are laid out by `comfy-table` in one plain style: no borders, no colours (the crate is
//! built without its terminal backend, so it cannot emit an ANSI code), headers in UPPERCASE,
//! columns two spaces apart, the first column flush left (so `grep ^ID` and `starts_with` work),
//! one line per row and no trailing spaces, so the output stays grep-, awk- and diff-friendly.
//! Durations read like `850ms`, `3m 12s`, `1h 4m` or `2d 3h`; past times like `5s ago`.

use chrono::{DateTime, Utc};
use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement};
use std::time::Duration;

/// Spaces between two columns.
const GAP: u16 = 2;

/// A table being filled row by row, then printed with [`Table::print`].
pub(crate) struct Table {
    inner: comfy_table::Table,
}

impl Table {
    /// A table with these column headers (upper-cased).
    pub(crate) fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut inner = comfy_table::Table::new();
        inner
            .load_preset(NOTHING)
            // Never wrap or shorten a cell to fit a terminal: a row stays one line.
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(
                headers
                    .into_iter()
                    .map(|header| header.as_ref().to_uppercase())
                    .collect::<Vec<_>>(),
            );
        for column in inner.column_iter_mut() {
            column.set_padding((0, GAP));
        }
        Table { inner }
    }

    /// Right-aligns these columns (0-based), header included: counts and durations.
    pub(crate) fn right(mut self, columns: impl IntoIterator<Item = usize>) -> Self {
        for index in columns {
            if let Some(column) = self.inner.column_mut(index) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        self
    }

    /// Adds a row. A control character in a cell (a newline or an escape sequence in an error
    /// message) becomes a space: one row is one line, and nothing reaches the terminal raw.
    pub(crate) fn row<I, S>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.inner.add_row(
            cells
                .into_iter()
                .map(|cell| plain(cell.as_ref()))
                .collect::<Vec<_>>(),
        );
        self
    }

    /// The table as text: one line per row, header first, no trailing spaces, no final newline.
    pub(crate) fn render(&self) -> String {
        self.render_indented("")
    }

    /// Like [`Table::render`], every line starting with `indent`.
    pub(crate) fn render_indented(&self, indent: &str) -> String {
        self.inner
            .lines()
            .map(|line| format!("{indent}{}", line.trim_end()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Prints the table on stdout.
    pub(crate) fn print(&self) {
        println!("{}", self.render());
    }

    /// Prints the table on stdout, every line starting with `indent`.
    pub(crate) fn print_indented(&self, indent: &str) {
        println!("{}", self.render_indented(indent));
    }
}

fn plain(text: &str) -> String {
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    } else {
        text.to_string()
    }
}

/// A duration for people, truncated, never rounded up: milliseconds under a second (`850ms`),
/// seconds to a tenth under a minute (`1.5s`, `42s`), then its two largest units (`3m 12s`,
/// `1h 4m`, `2d 3h`), a whole number of one unit alone (`5m`, `1h`); `0s` for zero and `<1ms`
/// for less than a millisecond.
pub(crate) fn human_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_string();
    }
    if duration < Duration::from_millis(1) {
        return "<1ms".to_string();
    }
    let secs = duration.as_secs();
    let millis = duration.subsec_millis();
    if secs == 0 {
        return format!("{millis}ms");
    }
    if secs < 60 {
        return match millis / 100 {
            0 => format!("{secs}s"),
            tenths => format!("{secs}.{tenths}s"),
        };
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3_600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    // Some unit is non-zero: the duration is at least a minute.
    let first = parts.iter().position(|(value, _)| *value > 0).unwrap_or(0);
    let mut text = format!("{}{}", parts[first].0, parts[first].1);
    if let Some((value, unit)) = parts.get(first + 1) {
        if *value > 0 {
            text.push_str(&format!(" {value}{unit}"));
        }
    }
    text
}

/// [`human_duration`] of a count of milliseconds, as the API reports durations.
pub(crate) fn human_ms(ms: u64) -> String {
    human_duration(Duration::from_millis(ms))
}

/// How long ago `at` was, to the second: `5s ago`, `3m 12s ago`, `just now` under a second,
/// and `in 4m` for a time ahead of this machine's clock.
pub(crate) fn ago(at: DateTime<Utc>) -> String {
    ago_from(at, Utc::now())
}

fn ago_from(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let elapsed = now.signed_duration_since(at);
    let secs = elapsed.num_seconds();
    if secs == 0 {
        return "just now".to_string();
    }
    let whole = Duration::from_secs(secs.unsigned_abs());
    if secs > 0 {
        format!("{} ago", human_duration(whole))
    } else {
        format!("in {}", human_duration(whole))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn d(ms: u64) -> String {
        human_ms(ms)
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(human_duration(Duration::ZERO), "0s");
        assert_eq!(human_duration(Duration::from_micros(1)), "<1ms");
        assert_eq!(human_duration(Duration::from_micros(999)), "<1ms");
        assert_eq!(d(1), "1ms");
        assert_eq!(d(850), "850ms");
        assert_eq!(d(999), "999ms");
        assert_eq!(d(1_000), "1s");
        assert_eq!(d(1_099), "1s");
        assert_eq!(d(1_500), "1.5s");
        assert_eq!(d(12_340), "12.3s");
        assert_eq!(d(42_000), "42s");
        assert_eq!(d(59_999), "59.9s", "truncated, not rounded up to a minute");
        assert_eq!(d(60_000), "1m", "an exact minute has no seconds");
        assert_eq!(
            d(61_500),
            "1m 1s",
            "milliseconds past the second unit are dropped"
        );
        assert_eq!(d(192_000), "3m 12s");
        assert_eq!(d(300_000), "5m");
        assert_eq!(d(3_600_000), "1h");
        assert_eq!(d(3_601_000), "1h", "the third unit is dropped");
        assert_eq!(d(3_840_000), "1h 4m");
        assert_eq!(d(3_870_000), "1h 4m", "truncated, not rounded");
        assert_eq!(d(86_400_000), "1d");
        assert_eq!(d(86_399_999), "23h 59m");
        assert_eq!(d(183_600_000), "2d 3h");
        assert_eq!(d(90_061_000), "1d 1h");
        assert_eq!(d(400 * 86_400_000), "400d");
        assert_eq!(human_duration(Duration::MAX).split(' ').count(), 2);
    }

    #[test]
    fn ago_counts_whole_seconds_back_or_forward() {
        let now = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
        let at = |secs: i64, ms: i64| {
            now - chrono::Duration::seconds(secs) - chrono::Duration::milliseconds(ms)
        };
        assert_eq!(ago_from(now, now), "just now");
        assert_eq!(ago_from(at(0, 850), now), "just now");
        assert_eq!(ago_from(at(0, -850), now), "just now", "slight clock skew");
        assert_eq!(ago_from(at(5, 0), now), "5s ago");
        assert_eq!(ago_from(at(5, 999), now), "5s ago");
        assert_eq!(ago_from(at(60, 0), now), "1m ago");
        assert_eq!(ago_from(at(192, 0), now), "3m 12s ago");
        assert_eq!(
            ago_from(at(2 * 86_400 + 3 * 3_600 + 7, 0), now),
            "2d 3h ago"
        );
        assert_eq!(ago_from(at(-240, 0), now), "in 4m");
    }

    #[test]
    fn tables_are_plain_aligned_and_trimmed() {
        let mut table = Table::new(["queue", "available", "state"]).right([1]);
        table
            .row(["mail", "3", ""])
            .row(["reports", "1200", "paused"]);
        table.row(["x", "1", "two\nlines \x1b[31mred"]);
        let text = table.render();
        assert_eq!(
            text,
            "QUEUE    AVAILABLE  STATE\n\
             mail             3\n\
             reports       1200  paused\n\
             x                1  two lines  [31mred"
        );
        assert!(!text.contains('\x1b'));
        assert_eq!(
            Table::new(["a", "b"]).render_indented("  "),
            "  A  B",
            "a table without rows is its header"
        );
    }
}
