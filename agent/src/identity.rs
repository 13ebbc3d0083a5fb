//! Who this host is: its name, its role, its addresses.

use jio_common::names::{HostName, Interface, Role};
use jio_common::values::InterfaceAddress;
use regex::Regex;

/// The system host name (short form, up to the first dot).
pub fn system_hostname() -> Option<String> {
    let name = nix::unistd::gethostname().ok()?.into_string().ok()?;
    let short = name.split('.').next().unwrap_or_default().to_string();
    (!short.is_empty()).then_some(short)
}

/// The role from the host name: the pattern's first capture group
/// (`compute12` → `compute`, `ocdb3-prod` → `ocdb` with the default pattern).
pub fn role_from_hostname(host: &HostName, pattern: &Regex) -> Option<Role> {
    let caps = pattern.captures(host.as_str())?;
    Role::new(caps.get(1)?.as_str()).ok()
}

/// Addresses of the non-loopback interfaces that are up, IPv4 first.
pub fn addresses() -> Vec<InterfaceAddress> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<(bool, InterfaceAddress)> = Vec::new();
    for ifa in addrs {
        if ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
            || !ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP)
            || Interface::new(ifa.interface_name.clone()).is_err()
        {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        let (v6, ip) = if let Some(a) = addr.as_sockaddr_in() {
            (false, a.ip().to_string())
        } else if let Some(a) = addr.as_sockaddr_in6() {
            (true, a.ip().to_string())
        } else {
            continue;
        };
        out.push((
            v6,
            InterfaceAddress {
                interface: ifa.interface_name,
                address: ip,
            },
        ));
    }
    out.sort_by(|a, b| (a.0, &a.1.interface).cmp(&(b.0, &b.1.interface)));
    out.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_ROLE_PATTERN;

    #[test]
    fn default_pattern_is_the_original_rule() {
        let re = Regex::new(DEFAULT_ROLE_PATTERN).unwrap();
        for (host, role) in [
            ("compute12", Some("compute")),
            ("ocdb3-prod", Some("ocdb")),
            ("controller1", Some("controller")),
            ("stmonwithosd1", Some("stmonwithosd")),
            ("gateway", None),
            ("12compute", None),
            ("Compute1", None),
        ] {
            let got = role_from_hostname(&HostName::new(host).unwrap(), &re);
            assert_eq!(got.as_ref().map(Role::as_str), role, "{host}");
        }
    }
}
