//! Durations as operators write them: `500ms`, `30s`, `10m`, `2h`, `1d`, or `0`.

use std::time::Duration;

/// Parses a duration; the error says what was expected.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let expected =
        || format!("invalid duration {s:?}: expected a number and a unit (ms, s, m, h, d), e.g. 30s or 10m");
    let n: u64 = num.parse().map_err(|_| expected())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(expected()),
    };
    ms.map(Duration::from_millis).ok_or_else(expected)
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
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "10",
            "s",
            "-5s",
            "1.5m",
            "10 m",
            "5x",
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
