//! Maintenance windows: when hosts may start an upgrade. Pure: parsing a window of
//! the rules, and whether windows are open at a given Unix time and when they next
//! open. The zone database is bundled (see the workspace manifest), so `jioctl` on a
//! laptop and every agent agree on what a window means.
//!
//! A window is `{"days": "mon-fri", "start": "22:00", "end": "06:00", "tz": "UTC"}`:
//! it opens on each listed day at `start` (local time in `tz`) and closes at the next
//! `end`, which may be the next day; `end` equal to `start` means 24 hours. Days are
//! `mon` … `sun`, ranges (`mon-fri`, `fri-mon`), lists (`sat,sun`), or `daily`.
//! `groups` (optional) limits a window to those groups (or roles).

use jiff::Timestamp;
use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use serde_json::{Map, Value};

/// One maintenance window.
#[derive(Debug, Clone)]
pub struct Window {
    /// Monday first.
    days: [bool; 7],
    start: Time,
    end: Time,
    tz: TimeZone,
    /// The groups (or roles) it applies to; `None`: every group.
    pub groups: Option<Vec<String>>,
    /// As the operator wrote it, for messages.
    pub text: String,
}

/// Whether hosts may start now, under a set of windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// No window applies: always open.
    Always,
    /// Open; it closes at this Unix time (the latest close of the open windows).
    Open { closes_at: u64 },
    /// Closed; it next opens at this Unix time (`None`: never in the coming week,
    /// which a valid window cannot be).
    Closed { opens_at: Option<u64> },
}

impl WindowState {
    pub fn open(self) -> bool {
        !matches!(self, WindowState::Closed { .. })
    }
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn parse_days(s: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    let t = s.trim().to_ascii_lowercase();
    if t == "daily" || t == "*" {
        return Ok([true; 7]);
    }
    let day = |d: &str| {
        DAYS.iter()
            .position(|x| *x == d.trim())
            .ok_or_else(|| format!("{d:?} is not a day (mon, tue, wed, thu, fri, sat, sun)"))
    };
    for part in t.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut i = a;
                loop {
                    days[i] = true;
                    if i == b {
                        break;
                    }
                    i = (i + 1) % 7;
                }
            }
            None => days[day(part)?] = true,
        }
    }
    Ok(days)
}

fn parse_time(s: &str) -> Result<Time, String> {
    let bad = || format!("{s:?} is not a time of day (HH:MM, 00:00 to 23:59)");
    let (h, m) = s.trim().split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (i8, i8) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    Time::new(h, m, 0, 0).map_err(|_| bad())
}

impl Window {
    /// Parses one window at `path` (for messages); every problem goes to `errors`.
    pub fn parse(path: &str, v: &Value, errors: &mut Vec<String>) -> Option<Window> {
        let Value::Object(o) = v else {
            errors.push(format!(
                "{path}: {v} must be an object such as {{\"days\": \"mon-fri\", \"start\": \"22:00\", \"end\": \"06:00\", \"tz\": \"UTC\"}}"
            ));
            return None;
        };
        let before = errors.len();
        for k in o.keys() {
            if !["days", "start", "end", "tz", "groups"].contains(&k.as_str()) {
                errors.push(format!(
                    "{path}: unknown key {k:?} (allowed: days, start, end, tz, groups)"
                ));
            }
        }
        let days = text_of(o, path, "days", errors).and_then(|d| {
            parse_days(&d)
                .map_err(|e| errors.push(format!("{path}.days: {e}")))
                .ok()
        });
        let start = time_of(o, path, "start", errors);
        let end = time_of(o, path, "end", errors);
        let tz_name = match o.get("tz") {
            None => Some("UTC".to_string()),
            Some(_) => text_of(o, path, "tz", errors),
        };
        let tz = tz_name.as_deref().and_then(|n| {
            TimeZone::get(n)
                .map_err(|_| {
                    errors.push(format!(
                        "{path}.tz: {n:?} is not a time zone (an IANA name such as \"UTC\" or \"Asia/Kolkata\")"
                    ))
                })
                .ok()
        });
        let groups = groups_of(o, path, errors);
        if errors.len() > before {
            return None;
        }
        let (days, start, end, tz) = (days?, start?, end?, tz?);
        let text = format!(
            "{} {}-{} {}",
            o.get("days").and_then(Value::as_str).unwrap_or_default(),
            &start.to_string()[..5],
            &end.to_string()[..5],
            tz_name.unwrap_or_default()
        );
        Some(Window {
            days,
            start,
            end,
            tz,
            groups,
            text,
        })
    }

    /// The Unix time of `time` on `date` in the window's zone (a time skipped by a
    /// clock change counts as the moment after the gap).
    fn at(&self, date: Date, time: Time) -> Option<i64> {
        date.to_datetime(time)
            .to_zoned_datetime(self.tz.clone())
            .ok()
            .map(|z| z.timestamp().as_second())
    }

    /// The spans (open, close) of the openings that start from the day before
    /// `now`'s local date to a week after it.
    fn spans(&self, now: i64) -> Vec<(i64, i64)> {
        let Ok(ts) = Timestamp::from_second(now) else {
            return Vec::new();
        };
        let today = ts.to_zoned_datetime(self.tz.clone()).date();
        let mut out = Vec::new();
        for offset in -1..=7i64 {
            let Ok(d) = today.checked_add(jiff::Span::new().days(offset)) else {
                continue;
            };
            if !self.days[weekday_index(d.weekday())] {
                continue;
            }
            let end_day = if self.end <= self.start {
                d.tomorrow().ok()
            } else {
                Some(d)
            };
            if let (Some(open), Some(close)) =
                (self.at(d, self.start), end_day.and_then(|e| self.at(e, self.end)))
            {
                out.push((open, close));
            }
        }
        out
    }
}

fn weekday_index(w: Weekday) -> usize {
    w.to_monday_zero_offset() as usize
}

/// Whether any of `windows` is open at `now` (Unix seconds), and until or from when.
pub fn state(windows: &[&Window], now: u64) -> WindowState {
    if windows.is_empty() {
        return WindowState::Always;
    }
    let n = i64::try_from(now).unwrap_or(i64::MAX);
    let spans: Vec<(i64, i64)> = windows.iter().flat_map(|w| w.spans(n)).collect();
    let closes = spans
        .iter()
        .filter(|(o, c)| *o <= n && n < *c)
        .map(|(_, c)| *c)
        .max();
    match closes {
        Some(c) => WindowState::Open {
            closes_at: u64::try_from(c).unwrap_or(0),
        },
        None => WindowState::Closed {
            opens_at: spans
                .iter()
                .map(|(o, _)| *o)
                .filter(|o| *o > n)
                .min()
                .and_then(|o| u64::try_from(o).ok()),
        },
    }
}

/// A window's text field `k`: a string, named when missing or not one.
fn text_of(o: &Map<String, Value>, path: &str, k: &str, errors: &mut Vec<String>) -> Option<String> {
    match o.get(k) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            errors.push(format!("{path}.{k}: {other} must be a string"));
            None
        }
        None => {
            errors.push(format!("{path}: {k:?} is missing"));
            None
        }
    }
}

/// A window's `start` or `end`, `HH:MM`.
fn time_of(o: &Map<String, Value>, path: &str, k: &str, errors: &mut Vec<String>) -> Option<Time> {
    text_of(o, path, k, errors).and_then(|t| {
        parse_time(&t)
            .map_err(|e| errors.push(format!("{path}.{k}: {e}")))
            .ok()
    })
}

/// A window's `groups`: a name or a non-empty list of them (`None`: every group).
fn groups_of(o: &Map<String, Value>, path: &str, errors: &mut Vec<String>) -> Option<Vec<String>> {
    match o.get("groups") {
        None => None,
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            Some(a.iter().filter_map(|x| x.as_str().map(String::from)).collect())
        }
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(other) => {
            errors.push(format!(
                "{path}.groups: {other} must be a group name or a non-empty list of them"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(v: &str) -> Window {
        let mut errors = Vec::new();
        let w = Window::parse("windows[0]", &serde_json::from_str(v).unwrap(), &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        w.unwrap()
    }

    fn unix(s: &str) -> u64 {
        s.parse::<Timestamp>().unwrap().as_second() as u64
    }

    #[test]
    fn a_night_window_spans_midnight() {
        let night = w(r#"{"days": "mon-fri", "start": "22:00", "end": "06:00", "tz": "UTC"}"#);
        // 2026-11-23 is a Monday.
        let cases = [
            ("2026-11-23T21:59:59Z", None, Some("2026-11-23T22:00:00Z")),
            ("2026-11-23T22:00:00Z", Some("2026-11-24T06:00:00Z"), None),
            ("2026-11-24T05:59:59Z", Some("2026-11-24T06:00:00Z"), None),
            ("2026-11-24T06:00:00Z", None, Some("2026-11-24T22:00:00Z")),
            // Friday night runs into Saturday morning; then nothing until Monday.
            ("2026-11-28T05:00:00Z", Some("2026-11-28T06:00:00Z"), None),
            ("2026-11-28T12:00:00Z", None, Some("2026-11-30T22:00:00Z")),
        ];
        for (now, closes, opens) in cases {
            let got = state(&[&night], unix(now));
            let want = match (closes, opens) {
                (Some(c), _) => WindowState::Open { closes_at: unix(c) },
                (None, o) => WindowState::Closed {
                    opens_at: o.map(unix),
                },
            };
            assert_eq!(got, want, "at {now}");
        }
    }

    #[test]
    fn zones_and_day_lists() {
        // 02:00-04:00 in Kolkata (UTC+05:30) on weekends is 20:30-22:30 UTC the day before.
        let ist = w(r#"{"days": "sat,sun", "start": "02:00", "end": "04:00", "tz": "Asia/Kolkata"}"#);
        assert!(
            state(&[&ist], unix("2026-11-27T20:30:00Z")).open(),
            "Sat 02:00 IST"
        );
        assert!(!state(&[&ist], unix("2026-11-27T22:30:00Z")).open());
        assert_eq!(
            state(&[&ist], unix("2026-11-28T12:00:00Z")),
            WindowState::Closed {
                opens_at: Some(unix("2026-11-28T20:30:00Z"))
            }
        );
        let all_day = w(r#"{"days": "daily", "start": "00:00", "end": "00:00"}"#);
        assert!(matches!(
            state(&[&all_day], unix("2026-11-25T13:00:00Z")),
            WindowState::Open { .. }
        ));
        assert_eq!(state(&[], 0), WindowState::Always);
        // Either of two windows.
        let morning = w(r#"{"days": "fri-mon", "start": "06:00", "end": "07:00"}"#);
        assert!(
            state(&[&ist, &morning], unix("2026-11-30T06:30:00Z")).open(),
            "Monday 06:30"
        );
        assert!(
            !state(&[&morning], unix("2026-11-25T06:30:00Z")).open(),
            "Wednesday"
        );
    }

    #[test]
    fn bad_windows_name_every_problem() {
        let mut errors = Vec::new();
        let v =
            serde_json::json!({"days": "mon-frid", "start": "25:00", "end": "6", "tz": "Mars/Base", "x": 1});
        assert!(Window::parse("windows[1]", &v, &mut errors).is_none());
        let all = errors.join("\n");
        for want in [
            "windows[1]: unknown key \"x\"",
            "windows[1].days: \"frid\" is not a day",
            "windows[1].start: \"25:00\" is not a time of day",
            "windows[1].end: \"6\" is not a time of day",
            "windows[1].tz: \"Mars/Base\" is not a time zone",
        ] {
            assert!(all.contains(want), "{want} in {all}");
        }
        let mut errors = Vec::new();
        assert!(Window::parse("w", &serde_json::json!({"start": "01:00"}), &mut errors).is_none());
        assert!(
            errors.iter().any(|e| e.contains("\"days\" is missing")),
            "{errors:?}"
        );
    }
}
