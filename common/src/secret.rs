//! Secrets (keys, passwords, tokens) and the files that hold them.
//!
//! A `Secret` prints as `***` in `Debug` and `Display`, so it cannot reach a log line
//! or an error message by accident. A file holding a secret, or a TLS private key,
//! must not be readable by group or others: such a file is refused at start, naming
//! the file and its mode, never its contents.

use std::fmt;
use std::path::Path;

/// A secret string that is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Refuses a file that group or others may read (or that cannot be examined). The
/// reason names the mode and the fix.
pub fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "is readable by group or others (mode {mode:04o}); run chmod 600 on it"
        ));
    }
    Ok(())
}

/// Reads a one-line secret from a private file (a trailing newline is dropped). The
/// reason of a failure never holds the contents.
pub fn read_secret_file(path: &Path) -> Result<Secret, String> {
    check_private(path)?;
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = String::from_utf8(text).map_err(|_| "is not UTF-8 text".to_string())?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err("is empty".into());
    }
    if secret.contains(['\n', '\r']) {
        return Err("holds more than one line".into());
    }
    Ok(Secret::new(secret))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** ***");
    }

    #[test]
    fn private_files_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pw");
        std::fs::write(&p, "hunter2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_secret_file(&p).unwrap_err();
        assert!(err.contains("mode 0644") && !err.contains("hunter2"), "{err}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file(&p).unwrap().expose(), "hunter2");
        std::fs::write(&p, "a\nb\n").unwrap();
        assert_eq!(read_secret_file(&p).unwrap_err(), "holds more than one line");
        std::fs::write(&p, "\n").unwrap();
        assert_eq!(read_secret_file(&p).unwrap_err(), "is empty");
        assert!(
            check_private(d.path())
                .unwrap_err()
                .contains("not a regular file")
        );
    }
}
