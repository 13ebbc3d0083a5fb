//! Percent-encoding of URL paths (store keys, object names), keeping `/`.

/// Everything but RFC 3986's unreserved characters and `/`.
const PATH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

/// Encodes every byte but unreserved characters and `/`.
pub fn path(p: &str) -> String {
    percent_encoding::utf8_percent_encode(p, PATH).to_string()
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
