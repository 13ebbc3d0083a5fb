//! Who this host is: its name and its addresses (its role comes from the
//! configuration, or from its name by `jio_common::roles`).

use jio_common::names::Interface;
use jio_common::values::InterfaceAddress;

/// The system host name (short form, up to the first dot).
pub fn system_hostname() -> Option<String> {
    let name = nix::unistd::gethostname().ok()?.into_string().ok()?;
    let short = name.split('.').next().unwrap_or_default().to_string();
    (!short.is_empty()).then_some(short)
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
