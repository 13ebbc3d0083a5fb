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
}
