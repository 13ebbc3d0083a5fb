//! Messages about a name that is not one of the known ones: the closest known
//! name ("did you mean"), and configuration-file errors as the `toml` crate reports
//! them (line, column and the line itself), with an unknown key's whole list of
//! keys replaced by the one it most likely meant.

/// The known name closest to `word`, when one is close enough to be a likely typo.
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(word, k), *k))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}

/// A configuration file's parse error for people: `what: ` then the parser's
/// report, every line after the first indented by `indent`. serde's
/// "unknown field `x`, expected one of ..." becomes "unknown key `x`" with the
/// closest key, or the keys when there are only a few.
pub fn config_file_error(what: &str, report: &str, indent: &str) -> String {
    let lines: Vec<String> = report.trim_end().lines().map(unknown_key).collect();
    format!("{what}: {}", lines.join(&format!("\n{indent}")))
}

fn unknown_key(line: &str) -> String {
    let Some(at) = line.find("unknown field `") else {
        return line.to_string();
    };
    let rest = &line[at + "unknown field `".len()..];
    let Some(end) = rest.find('`') else {
        return line.to_string();
    };
    let name = &rest[..end];
    let known: Vec<&str> = rest[end + 1..].split('`').skip(1).step_by(2).collect();
    let hint = match closest(name, &known) {
        Some(k) => format!("did you mean `{k}`?"),
        None if known.is_empty() => "this table takes no keys".to_string(),
        None if known.len() <= 6 => format!("the keys are {}", quoted(&known)),
        None => format!(
            "not one of the {} keys (man 5 agent.toml lists them)",
            known.len()
        ),
    };
    format!("{}unknown key `{name}`: {hint}", &line[..at])
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_likely_typo_gets_its_key_and_nonsense_gets_none() {
        let keys = ["store", "prefix", "role_pattern", "state_dir", "lease_ttl"];
        assert_eq!(closest("stor", &keys), Some("store"));
        assert_eq!(closest("role_patern", &keys), Some("role_pattern"));
        assert_eq!(closest("statedir", &keys), Some("state_dir"));
        assert_eq!(closest("bogus", &keys), None);
    }

    #[test]
    fn unknown_keys_are_named_with_the_closest_or_the_few_keys() {
        let report = "TOML parse error at line 2, column 1\n  |\n2 | stor = 1\n  | ^^^^\nunknown field `stor`, expected one of `store`, `prefix`, `role_pattern`\n";
        assert_eq!(
            config_file_error("a.toml", report, "  "),
            "a.toml: TOML parse error at line 2, column 1\n    |\n  2 | stor = 1\n    | ^^^^\n  unknown key `stor`: did you mean `store`?"
        );
        let few = "unknown field `zzz`, expected `store` or `prefix`";
        assert_eq!(
            config_file_error("b.toml", few, ""),
            "b.toml: unknown key `zzz`: the keys are `store`, `prefix`"
        );
        let many: Vec<String> = (0..10).map(|i| format!("`key{i}`")).collect();
        let line = format!("unknown field `zzz`, expected one of {}", many.join(", "));
        assert_eq!(
            config_file_error("c.toml", &line, ""),
            "c.toml: unknown key `zzz`: not one of the 10 keys (man 5 agent.toml lists them)"
        );
        // Anything else passes through as the parser said it.
        assert_eq!(
            config_file_error("d.toml", "invalid basic string, expected `\"`", ""),
            "d.toml: invalid basic string, expected `\"`"
        );
    }
}
