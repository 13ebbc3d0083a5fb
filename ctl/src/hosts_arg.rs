//! Hosts named on the command line, either way: as arguments (`hold compute7
//! compute8`) or as `run` names them (`--hosts compute7,compute8`). A leaf: the
//! commands use it, it uses none of them.

use jio_common::names::HostName;

use crate::exit::Failure;

/// The hosts a command names, given either way: as arguments (`hold compute7
/// compute8`) or as `run` names them (`--hosts compute7,compute8`). Both at once
/// must name the same hosts, or it is a usage error that shows both.
pub fn hosts_named(arguments: &[HostName], flag: &[HostName]) -> Result<Vec<HostName>, Failure> {
    fn set(h: &[HostName]) -> std::collections::BTreeSet<&HostName> {
        h.iter().collect()
    }
    if arguments.is_empty() || flag.is_empty() || set(arguments) == set(flag) {
        return Ok(if arguments.is_empty() { flag } else { arguments }.to_vec());
    }
    let list = |h: &[HostName]| h.iter().map(HostName::as_str).collect::<Vec<_>>().join(" ");
    Err(Failure::usage(format!(
        "hosts given two ways that differ: as arguments ({}) and with --hosts ({}); name them one way (nothing was written)",
        list(arguments),
        list(flag).replace(' ', ",")
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    fn hosts(names: &[&str]) -> Vec<HostName> {
        names.iter().map(|n| HostName::new(*n).unwrap()).collect()
    }

    #[test]
    fn hosts_named_either_way_or_both_alike() {
        let ab = hosts(&["compute1", "compute2"]);
        let ba = hosts(&["compute2", "compute1"]);
        assert_eq!(hosts_named(&ab, &[]).unwrap(), ab);
        assert_eq!(hosts_named(&[], &ba).unwrap(), ba);
        assert_eq!(
            hosts_named(&ab, &ba).unwrap(),
            ab,
            "the same hosts in another order"
        );
        assert!(hosts_named(&[], &[]).unwrap().is_empty());
        let e = hosts_named(&ab, &hosts(&["compute2"])).unwrap_err();
        assert_eq!(e.code(), crate::exit::USAGE);
        assert_eq!(
            format!("{e:?}"),
            "exit 64: hosts given two ways that differ: as arguments (compute1 compute2) and with --hosts (compute2); name them one way (nothing was written)"
        );
    }
}
