//! Percent-encoding of URL paths (store keys, object names), keeping `/`.

/// Encodes every byte but unreserved characters and `/`.
pub fn path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Bytes for a message: printable ASCII as it is, everything else as `\xNN`, at
/// most 200 bytes of input (longer input ends with `...`).
pub fn escape_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len().min(200) + 8);
    for &c in b.iter().take(200) {
        match c {
            b' '..=b'~' if c != b'\\' => out.push(c as char),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    if b.len() > 200 {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_slashes_encodes_the_rest() {
        assert_eq!(
            super::path("h1/v2/20261121T101500Z-configured.log"),
            "h1/v2/20261121T101500Z-configured.log"
        );
        assert_eq!(super::path("a b/ü?#%"), "a%20b/%C3%BC%3F%23%25");
    }

    #[test]
    fn escapes_what_is_not_printable_ascii() {
        assert_eq!(super::escape_bytes(b"v\xff2"), "v\\xff2");
        assert_eq!(super::escape_bytes(b"a\\b\n"), "a\\x5cb\\x0a");
        assert!(super::escape_bytes(&[b'a'; 300]).ends_with("..."));
    }
}
