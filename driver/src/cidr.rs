//! CIDR blocks: parsing (`10.0.0.0/24`, `fd00::/64`, or a bare address as a single host) and
//! containment.
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `address` is inside this block.
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(n)), self.prefix, 32) == masked(u128::from(u32::from(a)), self.prefix, 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                masked(u128::from(n), self.prefix, 128) == masked(u128::from(a), self.prefix, 128)
            }
            _ => false,
        }
    }
}

impl From<IpAddr> for Cidr {
    /// The single-host block of `address`.
    fn from(address: IpAddr) -> Self {
        Cidr { network: address, prefix: if address.is_ipv4() { 32 } else { 128 } }
    }
}

fn masked(bits: u128, prefix: u8, width: u8) -> u128 {
    let host_bits = u32::from(width - prefix);
    if host_bits >= 128 { 0 } else { bits >> host_bits }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network = IpAddr::from_str(address).map_err(|_| format!("{text:?} is not an IP address or CIDR block"))?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("{text:?} has an invalid prefix length"))?,
            None => width,
        };
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn containment() {
        let block: Cidr = "10.90.89.0/24".parse().unwrap();
        assert!(block.contains(ip("10.90.89.66")));
        assert!(!block.contains(ip("10.90.90.1")));
        assert!(!block.contains(ip("::1")));
        let host: Cidr = "10.0.0.1".parse().unwrap();
        assert!(host.contains(ip("10.0.0.1")) && !host.contains(ip("10.0.0.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("192.0.2.1")));
        let v6: Cidr = "fd00::/64".parse().unwrap();
        assert!(v6.contains(ip("fd00::1")) && !v6.contains(ip("fd01::1")));
    }

    #[test]
    fn bad_input_is_an_error() {
        for bad in ["", "10.0.0.0/33", "10.0.0/8", "fd00::/129", "not-an-ip", "10.0.0.0/-1"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} accepted");
        }
        assert_eq!("10.0.0.7/32".parse::<Cidr>().unwrap().to_string(), "10.0.0.7/32");
    }
}
