//! Where a coordinator listens, as both binaries take it on their command
//! line (`nq-worker --connect`, `nq-coord status --connect`, `nq-coord
//! health --connect`): one parser, so that every client accepts the same
//! forms and says the same thing about the ones it refuses.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The coordinator's port when an address names none.
pub const DEFAULT_PORT: u16 = 50051;

/// The forms [`CoordinatorAddress`] accepts, for error messages.
pub const ADDRESS_FORMS: &str = "HOST, HOST:PORT, http://HOST:PORT or https://HOST:PORT";

/// An address that [`CoordinatorAddress`] refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{input}` is not a coordinator address ({reason}); use {ADDRESS_FORMS} \
     (the port defaults to {DEFAULT_PORT})"
)]
pub struct AddressError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// A coordinator address: a host (name, IPv4, or bracketed IPv6), a port,
/// and whether to speak TLS.
///
/// Parses `host`, `host:port`, `http://host[:port]` and `https://host[:port]`
/// (a bare IPv6 address such as `::1` too); the port defaults to
/// [`DEFAULT_PORT`]. Displays as the URI a client dials.
///
/// ```
/// use nq_proto::address::CoordinatorAddress;
/// let c: CoordinatorAddress = "10.0.0.5".parse().unwrap();
/// assert_eq!(c.to_string(), "http://10.0.0.5:50051");
/// let c: CoordinatorAddress = "http://[::1]:7000".parse().unwrap();
/// assert_eq!(c.to_string(), "http://[::1]:7000");
/// let c: CoordinatorAddress = "https://coord:443".parse().unwrap();
/// assert!(c.tls());
/// assert!("grpc://coord:443".parse::<CoordinatorAddress>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorAddress {
    host: String,
    port: u16,
    tls: bool,
}

impl CoordinatorAddress {
    /// Whether a client speaks TLS to it (`https://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The same address, spoken to over TLS.
    pub fn with_tls(self) -> CoordinatorAddress {
        CoordinatorAddress { tls: true, ..self }
    }

    /// The host part (IPv6 addresses keep their brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A gRPC endpoint for this address, with no timeouts and no TLS
    /// configuration yet: the caller adds its own.
    pub fn endpoint(&self) -> tonic::transport::Endpoint {
        // The parser admits only a host of URI characters and a numeric
        // port, so the URI this displays as always parses.
        tonic::transport::Endpoint::from_shared(self.to_string())
            .expect("a parsed coordinator address is a valid URI")
    }
}

impl From<SocketAddr> for CoordinatorAddress {
    fn from(addr: SocketAddr) -> CoordinatorAddress {
        let host = match addr.ip() {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        };
        CoordinatorAddress {
            host,
            port: addr.port(),
            tls: false,
        }
    }
}

impl FromStr for CoordinatorAddress {
    type Err = AddressError;

    fn from_str(input: &str) -> Result<CoordinatorAddress, AddressError> {
        let bad = |reason| AddressError {
            input: input.to_owned(),
            reason,
        };
        let (rest, tls) = match input.split_once("://") {
            Some(("http", rest)) => (rest, false),
            Some(("https", rest)) => (rest, true),
            Some(_) => return Err(bad("the scheme must be http:// or https://")),
            None => (input, false),
        };
        // A trailing slash is harmless (`http://host:port/`); any other path is not.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Err(bad("the host is missing"));
        }
        if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
            return Err(bad("it must not contain a path, query, user or spaces"));
        }
        // A bare IPv6 address (`::1`) has colons that are not a port's.
        if let Ok(ip) = rest.parse::<Ipv6Addr>() {
            return Ok(CoordinatorAddress {
                host: format!("[{ip}]"),
                port: DEFAULT_PORT,
                tls,
            });
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (ip, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address needs its closing `]`"))?;
            if ip.parse::<Ipv6Addr>().is_err() {
                return Err(bad("the bracketed host is not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected `:PORT` after the IPv6 address"))?,
                ),
            };
            (&rest[..ip.len() + 2], port)
        } else {
            match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => {
                    return Err(bad("the port must be a number from 1 to 65535"));
                }
                Ok(p) => p,
            },
        };
        Ok(CoordinatorAddress {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

impl fmt::Display for CoordinatorAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_every_accepted_form() {
        let cases = [
            ("coord", "http://coord:50051"),
            ("coord:7000", "http://coord:7000"),
            ("10.0.0.5", "http://10.0.0.5:50051"),
            ("http://coord", "http://coord:50051"),
            ("http://127.0.0.1:7000/", "http://127.0.0.1:7000"),
            ("[::1]", "http://[::1]:50051"),
            ("::1", "http://[::1]:50051"),
            ("[::1]:7000", "http://[::1]:7000"),
            ("http://[fe80::1]:9", "http://[fe80::1]:9"),
            ("https://coord", "https://coord:50051"),
            ("https://127.0.0.1:7000/", "https://127.0.0.1:7000"),
        ];
        for (input, want) in cases {
            let c: CoordinatorAddress =
                input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(c.to_string(), want, "{input}");
            // Every parsed address makes an endpoint of the same URI.
            assert_eq!(
                c.endpoint().uri().to_string(),
                format!("{want}/"),
                "{input}"
            );
        }
    }

    #[test]
    fn bad_addresses_name_the_accepted_forms() {
        for input in [
            "",
            "http://",
            ":50051",
            "coord:0",
            "coord:http",
            "coord:99999",
            "grpc://coord:1",
            "https://",
            "coord:1/path",
            "[::1",
            "[nope]:1",
            "a b",
            "bad host",
            "coord:1:2",
        ] {
            let err = input.parse::<CoordinatorAddress>().unwrap_err().to_string();
            assert!(err.contains(ADDRESS_FORMS), "{input}: {err}");
            assert!(err.contains(&format!("`{input}`")), "{input}: {err}");
        }
    }

    #[test]
    fn tls_follows_the_scheme_or_is_asked_for() {
        let plain: CoordinatorAddress = "coord".parse().unwrap();
        assert!(!plain.tls());
        let tls = plain.with_tls();
        assert!(tls.tls());
        assert_eq!(tls.to_string(), "https://coord:50051");
        assert_eq!((tls.host(), tls.port()), ("coord", DEFAULT_PORT));
    }

    #[test]
    fn socket_addresses_convert() {
        let v6: SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(CoordinatorAddress::from(v6).to_string(), "http://[::1]:5");
        let v4: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            CoordinatorAddress::from(v4).to_string(),
            "http://127.0.0.1:9"
        );
    }
}
