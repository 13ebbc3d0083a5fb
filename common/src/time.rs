//! Wall-clock helpers: the time now, and Unix times written for names and for people.

/// Seconds since the Unix epoch: the wall clock itself (`clock::SystemClock` and
/// the edges of the programs read it here).
#[allow(clippy::disallowed_methods)]
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch (the clock an agent publishes in its record).
#[allow(clippy::disallowed_methods)]
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time (UTC), sortable and safe in file and object
/// names: the stamp of rollout and command ids and of run directories.
pub fn utc_stamp(secs: u64) -> String {
    utc(secs, "%Y%m%dT%H%M%SZ")
}

/// `YYYY-MM-DD HH:MM:SS UTC`: a Unix time as people read it in messages.
pub fn utc_display(secs: u64) -> String {
    utc(secs, "%Y-%m-%d %H:%M:%S UTC")
}

fn utc(secs: u64, format: &str) -> String {
    // Beyond jiff's range (year 9999) only for nonsense read from the store.
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    t.strftime(format).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn stamps() {
        assert_eq!(super::utc_stamp(0), "19700101T000000Z");
        assert_eq!(super::utc_stamp(951_782_400), "20000229T000000Z");
        assert_eq!(super::utc_stamp(1_795_267_815), "20261121T133015Z");
        assert_eq!(super::utc_display(1_795_267_815), "2026-11-21 13:30:15 UTC");
        assert!(super::utc_stamp(u64::MAX).starts_with("9999"));
    }
}
