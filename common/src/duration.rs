//! Durations as operators write them: `500ms`, `30s`, `10m`, `2h`, `1d`, or `0`.

use std::time::Duration;

/// Parses a duration, by jiff's "friendly" format (`90s`, `1h30m`, `1h 30m`,
/// `2 hours`, `1.5h`), with a day as 24 hours; `0` alone is zero. Negative
/// durations, months and years are refused. The error says what was expected.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let expected = || {
        format!(
            "invalid duration {s:?}: expected numbers with units (ms, s, m, h, d), e.g. 30s, 10m or 1h30m"
        )
    };
    let span: jiff::Span = t.parse().map_err(|_| expected())?;
    if span.is_negative() {
        return Err(expected());
    }
    let d = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| expected())?;
    let d = Duration::try_from(d).map_err(|_| expected())?;
    if !d.is_zero() && d < Duration::from_millis(1) {
        return Err(format!("invalid duration {s:?}: below the smallest unit, 1ms"));
    }
    Ok(d)
}

/// Formats a duration in the largest unit that is exact.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms == 0 { "0".into() } else { format!("{ms}ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1d12h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse("2m30s"), Ok(Duration::from_secs(150)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "10",
            "s",
            "-5s",
            "5x",
            "1mo",
            "2y",
            "30s10m5x",
            "1us",
            "5ns",
            "99999999999999999999d",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for s in ["30s", "10m", "2h", "1d", "250ms", "0", "90s"] {
            assert_eq!(format(parse(s).unwrap()), s);
        }
    }
}
